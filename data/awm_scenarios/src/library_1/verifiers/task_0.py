def verify_task_completion(initial_db_path: str, final_db_path: str, final_answer: str | None = None) -> dict:
    """Task 0: Priya Raman borrows a print copy of 'Project Hail Mary' held at the Central Library."""
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
        member = query(initial_db_path, "SELECT id FROM members WHERE full_name = ?", ("Priya Raman",))
        central = query(initial_db_path, "SELECT id FROM branches WHERE name = ?", ("Central Library",))
        if len(member) != 1 or len(central) != 1:
            return {"result": "others"}
        member_id, central_id = member[0][0], central[0][0]

        initial_loan_ids = {r[0] for r in query(initial_db_path, "SELECT id FROM loans")}
        new_loans = [
            r
            for r in query(
                final_db_path,
                "SELECT l.id, l.status, c.id, c.branch_id, c.status, b.title, b.format "
                "FROM loans l JOIN copies c ON c.id = l.copy_id JOIN books b ON b.id = c.book_id "
                "WHERE l.member_id = ?",
                (member_id,),
            )
            if r[0] not in initial_loan_ids
        ]
        if len(new_loans) != 1:
            return {"result": "others"}
        _, loan_status, _, branch_id, copy_status, title, fmt = new_loans[0]
        if loan_status != "active" or copy_status != "on_loan":
            return {"result": "others"}
        if title != "Project Hail Mary" or fmt != "print" or branch_id != central_id:
            return {"result": "others"}
        return {"result": "complete"}
    except Exception:
        return {"result": "others"}
