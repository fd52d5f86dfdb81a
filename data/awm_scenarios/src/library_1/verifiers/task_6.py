def verify_task_completion(initial_db_path: str, final_db_path: str, final_answer: str | None = None) -> dict:
    """Task 6: renew Aiko Tanaka's expired card, then check out 'Braiding Sweetgrass' from the Central Library."""
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
        member = query(
            initial_db_path, "SELECT id, expires_on FROM members WHERE full_name = ?", ("Aiko Tanaka",)
        )
        central = query(initial_db_path, "SELECT id FROM branches WHERE name = ?", ("Central Library",))
        if len(member) != 1 or len(central) != 1:
            return {"result": "others"}
        member_id, old_expiry = member[0]
        after = query(final_db_path, "SELECT status, expires_on FROM members WHERE id = ?", (member_id,))
        if len(after) != 1 or after[0][0] != "active" or not str(after[0][1]) > str(old_expiry):
            return {"result": "others"}
        # the renewed card must be valid well into the future (a one-year renewal from the desk)
        if not str(after[0][1]) >= "2026-01-01":
            return {"result": "others"}
        initial_loan_ids = {r[0] for r in query(initial_db_path, "SELECT id FROM loans")}
        new_loans = [
            r
            for r in query(
                final_db_path,
                "SELECT l.id, l.status, c.branch_id, b.title FROM loans l JOIN copies c ON c.id = l.copy_id "
                "JOIN books b ON b.id = c.book_id WHERE l.member_id = ?",
                (member_id,),
            )
            if r[0] not in initial_loan_ids
        ]
        if len(new_loans) != 1:
            return {"result": "others"}
        _, status, branch_id, title = new_loans[0]
        if status != "active" or branch_id != central[0][0] or title != "Braiding Sweetgrass":
            return {"result": "others"}
        return {"result": "complete"}
    except Exception:
        return {"result": "others"}
