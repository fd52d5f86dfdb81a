def verify_task_completion(initial_db_path: str, final_db_path: str, final_answer: str | None = None) -> dict:
    """Task 3: hold on the print edition of 'Circe' for Helen Kowalczyk, pickup at the Riverside Branch."""
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
        member = query(initial_db_path, "SELECT id FROM members WHERE full_name = ?", ("Helen Kowalczyk",))
        riverside = query(initial_db_path, "SELECT id FROM branches WHERE name = ?", ("Riverside Branch",))
        if len(member) != 1 or len(riverside) != 1:
            return {"result": "others"}
        member_id, riverside_id = member[0][0], riverside[0][0]
        initial_hold_ids = {r[0] for r in query(initial_db_path, "SELECT id FROM holds")}
        new_holds = [
            r
            for r in query(
                final_db_path,
                "SELECT h.id, h.status, h.pickup_branch_id, b.title, b.author, b.format "
                "FROM holds h JOIN books b ON b.id = h.book_id WHERE h.member_id = ?",
                (member_id,),
            )
            if r[0] not in initial_hold_ids
        ]
        if len(new_holds) != 1:
            return {"result": "others"}
        _, status, pickup, title, author, fmt = new_holds[0]
        if status != "waiting" or pickup != riverside_id:
            return {"result": "others"}
        if title != "Circe" or author != "Madeline Miller" or fmt != "print":
            return {"result": "others"}
        return {"result": "complete"}
    except Exception:
        return {"result": "others"}
