def verify_task_completion(initial_db_path: str, final_db_path: str, final_answer: str | None = None) -> dict:
    """Task 5: Samuel Adeyemi's new email, phone and home branch (Eastgate)."""
    import re
    import sqlite3

    def query(db_path: str, sql: str, params: tuple = ()) -> list:
        try:
            conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
            try:
                return conn.execute(sql, params).fetchall()
            finally:
                conn.close()
        except Exception:
            return []

    try:
        before = query(
            initial_db_path, "SELECT id, card_number FROM members WHERE full_name = ?", ("Samuel Adeyemi",)
        )
        eastgate = query(initial_db_path, "SELECT id FROM branches WHERE name = ?", ("Eastgate Branch",))
        if len(before) != 1 or len(eastgate) != 1:
            return {"result": "others"}
        member_id, card_number = before[0]
        after = query(
            final_db_path,
            "SELECT full_name, card_number, email, phone, home_branch_id FROM members WHERE id = ?",
            (member_id,),
        )
        if len(after) != 1:
            return {"result": "others"}
        full_name, final_card, email, phone, home_branch_id = after[0]
        if full_name != "Samuel Adeyemi" or final_card != card_number:
            return {"result": "others"}
        if (email or "").strip().lower() != "samuel.adeyemi@fastmail.com":
            return {"result": "others"}
        if re.sub(r"\D", "", phone or "") != "5553182270":
            return {"result": "others"}
        if home_branch_id != eastgate[0][0]:
            return {"result": "others"}
        return {"result": "complete"}
    except Exception:
        return {"result": "others"}
