"""Replay policies for library_1: a reference solution and realistic failures per task.

Each entry becomes one line of data/awm_scenarios/solutions.jsonl. ``expected`` is what the task's
verifier returns after the steps run against a fresh database. Authored for echo_trl.
"""

BC_PHM_PRINT_CENTRAL = "31994002104119"
BC_PHM_AUDIO_CENTRAL = "31994002104143"
BC_OVERSTORY_MARCUS = "31994002104168"
BC_SAPIENS_MARCUS = "31994002104275"
BC_SAPIENS_DANIEL = "31994002104283"
BC_SWEETGRASS_CENTRAL = "31994002104218"
BC_SWEETGRASS_EASTGATE = "31994002104226"


def step(tool_name: str, **arguments) -> dict:
    return {"tool_name": tool_name, "arguments": arguments}


def _t0() -> list[dict]:
    find = [
        step("search_members", query="Priya Raman"),
        step("search_books", query="Project Hail Mary", format="print"),
    ]
    return [
        {
            "label": "reference",
            "expected": "complete",
            "steps": [
                *find,
                step("get_book", book_id=1),
                step("checkout_copy", member_id=1, barcode=BC_PHM_PRINT_CENTRAL),
            ],
            "final_answer": "Checked out Project Hail Mary (print, barcode 31994002104119) to Priya Raman; "
            "it is due back on 2025-04-04.",
        },
        {
            "label": "reference_alt",
            "expected": "complete",
            "steps": [
                step("search_members", query="21190004512"),
                step("search_books", query="Hail Mary", available_only=True, branch_id=1),
                step("get_book", book_id=1),
                step("checkout_copy", member_id=1, barcode=BC_PHM_PRINT_CENTRAL),
                step("list_member_loans", member_id=1),
            ],
            "final_answer": "Priya Raman now has Project Hail Mary (print) from Central, due 2025-04-04.",
        },
        {
            "label": "wrong_args",
            "expected": "others",
            "steps": [
                step("search_members", query="Priya Raman"),
                step("search_books", query="Project Hail Mary"),
                step("checkout_copy", member_id=1, barcode=BC_PHM_AUDIO_CENTRAL),
            ],
            "final_answer": "Checked out Project Hail Mary to Priya Raman.",
        },
        {
            "label": "unknown_tool",
            "expected": "others",
            "steps": [
                *find,
                step("borrow_book", member_id=1, book_id=1, branch_id=1),
            ],
            "final_answer": None,
        },
        {
            "label": "stop_early",
            "expected": "others",
            "steps": [
                *find,
                step("get_book", book_id=1),
            ],
            "final_answer": "A print copy is available at the Central Library (barcode 31994002104119).",
        },
        {
            "label": "invalid_id",
            "expected": "others",
            "steps": [
                *find,
                step("checkout_copy", member_id=1, barcode="31994002104911"),
            ],
            "final_answer": None,
        },
    ]


def _t1() -> list[dict]:
    find = [
        step("search_members", query="Marcus Oyelaran"),
        step("list_member_loans", member_id=2),
    ]
    return [
        {
            "label": "reference",
            "expected": "complete",
            "steps": [
                *find,
                step("return_copy", barcode=BC_OVERSTORY_MARCUS),
            ],
            "final_answer": "The Overstory is checked in: 13 days late, a $3.25 overdue fine was recorded, and "
            "the copy is on the Riverside hold shelf for Helen Kowalczyk.",
        },
        {
            "label": "reference_alt",
            "expected": "complete",
            "steps": [
                step("search_members", query="Oyelaran"),
                step("get_member", member_id=2),
                step("list_member_loans", member_id=2, status="active"),
                step("return_copy", barcode=BC_OVERSTORY_MARCUS),
                step("list_member_fines", member_id=2, status="unpaid"),
            ],
            "final_answer": "Checked in The Overstory; Marcus now owes $14.00 in total.",
        },
        {
            "label": "wrong_args",
            "expected": "others",
            "steps": [
                *find,
                step("return_copy", barcode=BC_SAPIENS_MARCUS),
            ],
            "final_answer": "Checked in Marcus's book.",
        },
        {
            "label": "unknown_tool",
            "expected": "others",
            "steps": [
                *find,
                step("check_in_item", barcode=BC_OVERSTORY_MARCUS),
            ],
            "final_answer": None,
        },
        {
            "label": "stop_early",
            "expected": "others",
            "steps": find,
            "final_answer": "Marcus has The Overstory (13 days overdue) and Sapiens checked out.",
        },
        {
            "label": "invalid_id",
            "expected": "others",
            "steps": [
                *find,
                step("return_copy", barcode="31994002104186"),
            ],
            "final_answer": None,
        },
    ]


def _t2() -> list[dict]:
    find = [
        step("search_members", query="Grace Liu"),
        step("list_member_loans", member_id=4),
    ]
    return [
        {
            "label": "reference",
            "expected": "complete",
            "steps": [
                *find,
                step("renew_loan", loan_id=4),
                step("renew_loan", loan_id=7),
            ],
            "final_answer": "Renewed Station Eleven and The Name of the Wind until 2025-04-04. The Left Hand of "
            "Darkness has used both renewals and Circe has a hold queue, so those stay as they are.",
        },
        {
            "label": "reference_alt",
            "expected": "complete",
            "steps": [
                *find,
                step("renew_loan", loan_id=4),
                step("renew_loan", loan_id=5),
                step("renew_loan", loan_id=6),
                step("renew_loan", loan_id=7),
            ],
            "final_answer": "Two of Grace's four loans were renewed; the other two could not be.",
        },
        {
            "label": "wrong_args",
            "expected": "others",
            "steps": [
                *find,
                step("renew_loan", loan_id=30),
                step("renew_loan", loan_id=8),
                step("renew_loan", loan_id=20),
            ],
            "final_answer": "Renewed Grace's loans.",
        },
        {
            "label": "unknown_tool",
            "expected": "others",
            "steps": [
                step("search_members", query="Grace Liu"),
                step("renew_all_loans", member_id=4),
            ],
            "final_answer": None,
        },
        {
            "label": "stop_early",
            "expected": "others",
            "steps": [
                *find,
                step("renew_loan", loan_id=4),
            ],
            "final_answer": "Renewed Station Eleven until 2025-04-04.",
        },
        {
            "label": "invalid_id",
            "expected": "others",
            "steps": [
                *find,
                step("renew_loan", loan_id=4),
                step("renew_loan", loan_id=70),
            ],
            "final_answer": None,
        },
    ]


def _t3() -> list[dict]:
    return [
        {
            "label": "reference",
            "expected": "complete",
            "steps": [
                step("search_members", query="Helen Kowalczyk"),
                step("search_books", query="Circe"),
                step("place_hold", member_id=3, book_id=4, pickup_branch_id=2),
            ],
            "final_answer": "Helen Kowalczyk is now second in the queue for Circe (print), pickup at Riverside.",
        },
        {
            "label": "reference_alt",
            "expected": "complete",
            "steps": [
                step("search_members", query="Kowalczyk"),
                step("list_branches"),
                step("search_books", query="Madeline Miller", format="print"),
                step("get_book", book_id=4),
                step("place_hold", member_id=3, book_id=4, pickup_branch_id=2),
                step("list_member_holds", member_id=3),
            ],
            "final_answer": "Hold placed on Circe for Helen Kowalczyk at the Riverside Branch.",
        },
        {
            "label": "wrong_args",
            "expected": "others",
            "steps": [
                step("search_members", query="Helen Kowalczyk"),
                step("search_books", query="Circe"),
                step("place_hold", member_id=3, book_id=5, pickup_branch_id=2),
            ],
            "final_answer": "Hold placed on Circe for Helen.",
        },
        {
            "label": "unknown_tool",
            "expected": "others",
            "steps": [
                step("search_members", query="Helen Kowalczyk"),
                step("search_books", query="Circe"),
                step("reserve_book", member_id=3, book_id=4, branch="Riverside Branch"),
            ],
            "final_answer": None,
        },
        {
            "label": "stop_early",
            "expected": "others",
            "steps": [
                step("search_members", query="Helen Kowalczyk"),
                step("search_books", query="Circe"),
            ],
            "final_answer": "All print copies of Circe are checked out or in repair.",
        },
        {
            "label": "invalid_id",
            "expected": "others",
            "steps": [
                step("search_members", query="Helen Kowalczyk"),
                step("search_books", query="Circe"),
                step("place_hold", member_id=3, book_id=4, pickup_branch_id=4),
            ],
            "final_answer": None,
        },
    ]


def _t4() -> list[dict]:
    find = [
        step("search_members", query="Marcus Oyelaran"),
        step("list_member_fines", member_id=2, status="unpaid"),
    ]
    return [
        {
            "label": "reference",
            "expected": "complete",
            "steps": [
                *find,
                step("pay_fine", fine_id=1, amount=3.5, method="cash"),
                step("pay_fine", fine_id=2, amount=1.25, method="cash"),
            ],
            "final_answer": "Recorded cash payments of $3.50 and $1.25; the $6.00 damage fine remains open.",
        },
        {
            "label": "reference_alt",
            "expected": "complete",
            "steps": [
                *find,
                step("pay_fine", fine_id=1, amount=4.75, method="cash"),
                step("pay_fine", fine_id=1, amount=3.5, method="cash"),
                step("pay_fine", fine_id=2, amount=1.25, method="cash"),
                step("get_member", member_id=2),
            ],
            "final_answer": "Both overdue fines are paid in cash; Marcus still owes $6.00 for a damaged item.",
        },
        {
            "label": "wrong_args",
            "expected": "others",
            "steps": [
                *find,
                step("pay_fine", fine_id=1, amount=3.5, method="card"),
                step("pay_fine", fine_id=2, amount=1.25, method="card"),
            ],
            "final_answer": "Paid both overdue fines.",
        },
        {
            "label": "unknown_tool",
            "expected": "others",
            "steps": [
                *find,
                step("pay_all_fines", member_id=2, method="cash"),
            ],
            "final_answer": None,
        },
        {
            "label": "stop_early",
            "expected": "others",
            "steps": [
                *find,
                step("pay_fine", fine_id=1, amount=3.5, method="cash"),
            ],
            "final_answer": "Recorded a cash payment of $3.50.",
        },
        {
            "label": "invalid_id",
            "expected": "others",
            "steps": [
                *find,
                step("pay_fine", fine_id=12, amount=3.5, method="cash"),
                step("pay_fine", fine_id=2, amount=1.25, method="cash"),
            ],
            "final_answer": None,
        },
    ]


def _t5() -> list[dict]:
    new = {"email": "samuel.adeyemi@fastmail.com", "phone": "(555) 318-2270"}
    return [
        {
            "label": "reference",
            "expected": "complete",
            "steps": [
                step("search_members", query="Samuel Adeyemi"),
                step("list_branches"),
                step("update_member", member_id=6, home_branch_id=3, **new),
            ],
            "final_answer": "Samuel Adeyemi's email, phone and home branch (Eastgate) are updated.",
        },
        {
            "label": "reference_alt",
            "expected": "complete",
            "steps": [
                step("search_members", query="Adeyemi"),
                step("get_member", member_id=6),
                step("list_branches"),
                step("update_member", member_id=6, **new),
                step("update_member", member_id=6, home_branch_id=3),
            ],
            "final_answer": "Updated Samuel's contact details and moved his home branch to Eastgate.",
        },
        {
            "label": "wrong_args",
            "expected": "others",
            "steps": [
                step("search_members", query="Samuel Adeyemi"),
                step("update_member", member_id=6, home_branch_id=2, **new),
            ],
            "final_answer": "Samuel's account is updated.",
        },
        {
            "label": "unknown_tool",
            "expected": "others",
            "steps": [
                step("search_members", query="Samuel Adeyemi"),
                step("update_member_contact", member_id=6, home_branch="Eastgate Branch", **new),
            ],
            "final_answer": None,
        },
        {
            "label": "stop_early",
            "expected": "others",
            "steps": [
                step("search_members", query="Samuel Adeyemi"),
                step("update_member", member_id=6, **new),
            ],
            "final_answer": "Updated Samuel's email and phone.",
        },
        {
            "label": "invalid_id",
            "expected": "others",
            "steps": [
                step("search_members", query="Samuel Adeyemi"),
                step("update_member", member_id=16, home_branch_id=3, **new),
            ],
            "final_answer": None,
        },
    ]


def _t6() -> list[dict]:
    return [
        {
            "label": "reference",
            "expected": "complete",
            "steps": [
                step("search_members", query="Aiko Tanaka"),
                step("get_member", member_id=5),
                step("renew_membership", member_id=5),
                step("search_books", query="Braiding Sweetgrass"),
                step("checkout_copy", member_id=5, barcode=BC_SWEETGRASS_CENTRAL),
            ],
            "final_answer": "Aiko's card is renewed until 2026-03-14 and Braiding Sweetgrass is checked out to her, "
            "due 2025-04-04.",
        },
        {
            "label": "reference_alt",
            "expected": "complete",
            "steps": [
                step("search_members", query="Aiko Tanaka"),
                step("search_books", query="Braiding Sweetgrass", available_only=True, branch_id=1),
                step("get_book", book_id=6),
                step("checkout_copy", member_id=5, barcode=BC_SWEETGRASS_CENTRAL),
                step("renew_membership", member_id=5),
                step("checkout_copy", member_id=5, barcode=BC_SWEETGRASS_CENTRAL),
            ],
            "final_answer": "Renewed Aiko's membership and checked out Braiding Sweetgrass.",
        },
        {
            "label": "wrong_args",
            "expected": "others",
            "steps": [
                step("search_members", query="Aiko Tanaka"),
                step("renew_membership", member_id=5),
                step("get_book", book_id=6),
                step("checkout_copy", member_id=5, barcode=BC_SWEETGRASS_EASTGATE),
            ],
            "final_answer": "Renewed Aiko's card and checked out Braiding Sweetgrass.",
        },
        {
            "label": "unknown_tool",
            "expected": "others",
            "steps": [
                step("search_members", query="Aiko Tanaka"),
                step("extend_membership", member_id=5, years=1),
                step("checkout_copy", member_id=5, barcode=BC_SWEETGRASS_CENTRAL),
            ],
            "final_answer": None,
        },
        {
            "label": "stop_early",
            "expected": "others",
            "steps": [
                step("search_members", query="Aiko Tanaka"),
                step("get_member", member_id=5),
                step("renew_membership", member_id=5),
            ],
            "final_answer": "Aiko's membership is renewed until 2026-03-14.",
        },
        {
            "label": "invalid_id",
            "expected": "others",
            "steps": [
                step("search_members", query="Aiko Tanaka"),
                step("renew_membership", member_id=15),
                step("checkout_copy", member_id=5, barcode=BC_SWEETGRASS_CENTRAL),
            ],
            "final_answer": None,
        },
    ]


def _t7() -> list[dict]:
    return [
        {
            "label": "reference",
            "expected": "complete",
            "steps": [
                step("search_members", query="Priya Raman"),
                step("create_reading_list", member_id=1, name="Spring Book Club 2025"),
                step("search_books", query="Pachinko"),
                step("add_book_to_reading_list", reading_list_id=3, book_id=7),
                step("search_books", query="A Gentleman in Moscow"),
                step("add_book_to_reading_list", reading_list_id=3, book_id=8),
            ],
            "final_answer": "Created 'Spring Book Club 2025' for Priya with Pachinko and A Gentleman in Moscow.",
        },
        {
            "label": "reference_alt",
            "expected": "complete",
            "steps": [
                step("search_members", query="Priya Raman"),
                step("list_member_reading_lists", member_id=1),
                step("search_books", query="Pachinko"),
                step("search_books", query="Gentleman in Moscow"),
                step(
                    "create_reading_list",
                    member_id=1,
                    name="Spring Book Club 2025",
                    description="Titles for the spring book club.",
                ),
                step("add_book_to_reading_list", reading_list_id=3, book_id=7, note="March meeting"),
                step("add_book_to_reading_list", reading_list_id=3, book_id=8, note="April meeting"),
            ],
            "final_answer": "The new list holds both book club titles.",
        },
        {
            "label": "wrong_args",
            "expected": "others",
            "steps": [
                step("search_members", query="Priya Raman"),
                step("create_reading_list", member_id=1, name="Spring Book Club"),
                step("add_book_to_reading_list", reading_list_id=3, book_id=7),
                step("add_book_to_reading_list", reading_list_id=3, book_id=8),
            ],
            "final_answer": "Created the book club list.",
        },
        {
            "label": "unknown_tool",
            "expected": "others",
            "steps": [
                step("search_members", query="Priya Raman"),
                step("create_reading_list", member_id=1, name="Spring Book Club 2025"),
                step("add_to_reading_list", list_id=3, book_ids=[7, 8]),
            ],
            "final_answer": None,
        },
        {
            "label": "stop_early",
            "expected": "others",
            "steps": [
                step("search_members", query="Priya Raman"),
                step("create_reading_list", member_id=1, name="Spring Book Club 2025"),
                step("search_books", query="Pachinko"),
                step("add_book_to_reading_list", reading_list_id=3, book_id=7),
            ],
            "final_answer": "Created the list and added Pachinko.",
        },
        {
            "label": "invalid_id",
            "expected": "others",
            "steps": [
                step("search_members", query="Priya Raman"),
                step("create_reading_list", member_id=1, name="Spring Book Club 2025"),
                step("add_book_to_reading_list", reading_list_id=30, book_id=7),
                step("add_book_to_reading_list", reading_list_id=30, book_id=8),
            ],
            "final_answer": None,
        },
    ]


def _t8() -> list[dict]:
    find = [
        step("search_members", query="Helen Kowalczyk"),
        step("list_member_holds", member_id=3),
    ]
    return [
        {
            "label": "reference",
            "expected": "complete",
            "steps": [
                *find,
                step("cancel_hold", hold_id=2),
                step("search_books", query="Project Hail Mary", format="audiobook"),
                step("place_hold", member_id=3, book_id=2, pickup_branch_id=2),
            ],
            "final_answer": "Cancelled the hold on The Overstory and placed a hold on the Project Hail Mary "
            "audiobook for pickup at Riverside.",
        },
        {
            "label": "reference_alt",
            "expected": "complete",
            "steps": [
                step("search_members", query="Kowalczyk"),
                step("get_member", member_id=3),
                step("list_member_holds", member_id=3),
                step("search_books", query="Project Hail Mary"),
                step("place_hold", member_id=3, book_id=2, pickup_branch_id=2),
                step("cancel_hold", hold_id=2),
            ],
            "final_answer": "Done: Overstory hold cancelled, audiobook hold placed at Riverside Branch.",
        },
        {
            "label": "wrong_args",
            "expected": "others",
            "steps": [
                *find,
                step("cancel_hold", hold_id=2),
                step("search_books", query="Project Hail Mary"),
                step("place_hold", member_id=3, book_id=1, pickup_branch_id=2),
            ],
            "final_answer": "Swapped Helen's hold to Project Hail Mary.",
        },
        {
            "label": "unknown_tool",
            "expected": "others",
            "steps": [
                *find,
                step("remove_hold", hold_id=2),
                step("place_hold", member_id=3, book_id=2, pickup_branch_id=2),
            ],
            "final_answer": None,
        },
        {
            "label": "stop_early",
            "expected": "others",
            "steps": [
                *find,
                step("cancel_hold", hold_id=2),
            ],
            "final_answer": "Cancelled Helen's hold on The Overstory.",
        },
        {
            "label": "invalid_id",
            "expected": "others",
            "steps": [
                *find,
                step("cancel_hold", hold_id=20),
                step("place_hold", member_id=3, book_id=2, pickup_branch_id=2),
            ],
            "final_answer": None,
        },
    ]


def _t9() -> list[dict]:
    find = [
        step("search_members", query="Daniel Brooks"),
        step("list_member_loans", member_id=8),
        step("return_copy", barcode=BC_SAPIENS_DANIEL),
    ]
    return [
        {
            "label": "reference",
            "expected": "complete",
            "steps": [
                *find,
                step("waive_fine", fine_id=7, reason="Branch closed for snow"),
            ],
            "final_answer": "Sapiens is checked in and the $0.75 overdue fine was waived (branch closed for snow).",
        },
        {
            "label": "reference_alt",
            "expected": "complete",
            "steps": [
                *find,
                step("list_member_fines", member_id=8, status="unpaid"),
                step("waive_fine", fine_id=7, reason="Branch closed for snow"),
                step("get_member", member_id=8),
            ],
            "final_answer": "Checked in Sapiens; the new fine is waived and Daniel owes nothing.",
        },
        {
            "label": "wrong_args",
            "expected": "others",
            "steps": [
                *find,
                step("waive_fine", fine_id=7, reason="Courtesy waiver for a late return"),
            ],
            "final_answer": "Checked in Sapiens and waived the fine.",
        },
        {
            "label": "unknown_tool",
            "expected": "others",
            "steps": [
                *find,
                step("forgive_fine", fine_id=7, reason="Branch closed for snow"),
            ],
            "final_answer": None,
        },
        {
            "label": "stop_early",
            "expected": "others",
            "steps": find,
            "final_answer": "Checked in Sapiens; a $0.75 overdue fine was assessed.",
        },
        {
            "label": "invalid_id",
            "expected": "others",
            "steps": [
                *find,
                step("waive_fine", fine_id=70, reason="Branch closed for snow"),
            ],
            "final_answer": None,
        },
    ]


SOLUTIONS: dict[int, list[dict]] = {
    0: _t0(),
    1: _t1(),
    2: _t2(),
    3: _t3(),
    4: _t4(),
    5: _t5(),
    6: _t6(),
    7: _t7(),
    8: _t8(),
    9: _t9(),
}
