"""Synthetic AWM-style episodes of a small, deterministic shop environment.

The demo's fallback when no bundled episodes exist, and a source of small, learnable episode files
for tests (a world model can learn their environment outputs: they are a fixed function of the
actions).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

_CATALOG_WORDS = {
    "headphones": ["Sony WH-1000", "Bose QC 45", "Anker Soundcore", "JBL Tune 760", "Sennheiser HD 450"],
    "keyboards": ["Logitech MX Keys", "Keychron K2", "Razer BlackWidow", "Corsair K70", "Apple Magic Keyboard"],
    "monitors": ["Dell U2723", "LG 27GP850", "Samsung Odyssey G5", "ASUS ProArt", "BenQ PD2700"],
    "backpacks": [
        "Osprey Daylite",
        "Herschel Little America",
        "North Face Borealis",
        "Peak Design Everyday",
        "Timbuk2 Authority",
    ],
}


def _catalog(seed: int = 0) -> dict[str, list[dict[str, Any]]]:
    rng = random.Random(seed)
    catalog, pid = {}, 1
    for category, titles in _CATALOG_WORDS.items():
        items = []
        for title in titles:
            items.append(
                {
                    "id": pid,
                    "title": title,
                    "category": category,
                    "price": round(rng.uniform(20, 400), 2),
                    "average_rating": round(rng.uniform(3.0, 5.0), 1),
                    "review_count": rng.randint(10, 5000),
                    "in_stock": rng.random() > 0.15,
                }
            )
            pid += 1
        catalog[category] = items
    return catalog


def synthetic_episodes(n_tasks: int = 24, per_task: int = 4, seed: int = 0) -> list[dict[str, Any]]:
    """AWM-style episodes (OpenEnv capture shape) of a small, deterministic shop environment.

    Each task asks for the best-rated product of a category under a budget; the agent searches,
    inspects one product, adds it to the cart and verifies. Environment outputs are a fixed
    function of the actions (a world model can learn them); rewards differ within a task (the
    agent sometimes picks the wrong product), so GRPO groups have non-zero advantages.
    """
    rng = random.Random(seed)
    catalog = _catalog(seed)
    episodes = []
    for t in range(n_tasks):
        category = list(catalog)[t % len(catalog)]
        budget = [100, 150, 200, 250, 300, 350][(t // len(catalog)) % 6]
        items = catalog[category]
        eligible = [p for p in items if p["price"] <= budget and p["in_stock"]]
        best = max(eligible, key=lambda p: p["average_rating"]) if eligible else None
        task = (
            f"Find the best-rated {category[:-1]} that is in stock and costs at most ${budget}, "
            f"and add one to my cart."
        )
        for _ in range(per_task):
            pick = best if best is not None and rng.random() < 0.5 else rng.choice(items)
            limit = rng.choice([3, 5])
            listed = sorted(items, key=lambda p: -p["average_rating"])[:limit]
            steps = [
                {
                    "action": {
                        "tool_name": "search_products",
                        "arguments": {"query": category, "sort_by": "average_rating", "limit": limit},
                    },
                    "observation": {
                        "tool_result": {"products": listed, "total": len(items)},
                        "reward_type": "tool_call_ok",
                        "done": False,
                    },
                },
                {
                    "action": {"tool_name": "get_product_by_id", "arguments": {"product_id": pick["id"]}},
                    "observation": {
                        "tool_result": {
                            "product": pick,
                            "offers": [
                                {
                                    "seller": "shop",
                                    "price": pick["price"],
                                    "currency": "USD",
                                    "in_stock": pick["in_stock"],
                                }
                            ],
                        },
                        "reward_type": "tool_call_ok",
                        "done": False,
                    },
                },
            ]
            if pick["in_stock"]:
                cart = {
                    "cart_id": 1,
                    "items": [
                        {"product_id": pick["id"], "title": pick["title"], "quantity": 1, "unit_price": pick["price"]}
                    ],
                    "subtotal": pick["price"],
                }
                steps.append(
                    {
                        "action": {
                            "tool_name": "add_item_to_cart",
                            "arguments": {"product_id": pick["id"], "quantity": 1},
                        },
                        "observation": {"tool_result": cart, "reward_type": "tool_call_ok", "done": False},
                    }
                )
            else:
                steps.append(
                    {
                        "action": {
                            "tool_name": "add_item_to_cart",
                            "arguments": {"product_id": pick["id"], "quantity": 1},
                        },
                        "observation": {
                            "error": f"Error: product {pick['id']} is out of stock",
                            "reward_type": "tool_call_error",
                            "done": False,
                        },
                    }
                )
            correct = best is not None and pick["id"] == best["id"]
            steps.append(
                {
                    "action": {"tool_name": "verify", "arguments": {}},
                    "observation": {
                        "verify_result": {"result": "complete" if correct else "incomplete"},
                        "reward_type": "complete" if correct else "incomplete",
                        "done": True,
                    },
                }
            )
            episodes.append(
                {
                    "scenario": f"shop_{category}",
                    "task": task,
                    "task_idx": t,
                    "tools": ["search_products", "get_product_by_id", "add_item_to_cart", "verify"],
                    "steps": steps,
                    "reward": 1.0 if correct else 0.1,
                }
            )
    return episodes


def write_episodes(episodes: list[dict[str, Any]], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        for ep in episodes:
            fh.write(json.dumps(ep) + "\n")
    return path
