def verify_task_completion(initial_db_path: str, final_db_path: str, final_answer: str | None = None) -> dict:
    """Task 8: cancel Helen Kowalczyk's hold on 'The Overstory'; hold the 'Project Hail Mary' audiobook at her home branch."""
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
            initial_db_path,
            "SELECT id, home_branch_id FROM members WHERE full_name = ?",
            ("Helen Kowalczyk",),
        )
        if len(member) != 1:
            return {"result": "others"}
        member_id, home_branch_id = member[0]
        old = query(
            initial_db_path,
            "SELECT h.id FROM holds h JOIN books b ON b.id = h.book_id "
            "WHERE h.member_id = ? AND b.title = 'The Overstory' AND h.status IN ('waiting', 'ready')",
            (member_id,),
        )
        if len(old) != 1:
            return {"result": "others"}
        cancelled = query(final_db_path, "SELECT status FROM holds WHERE id = ?", (old[0][0],))
        if len(cancelled) != 1 or cancelled[0][0] != "cancelled":
            return {"result": "others"}
        initial_hold_ids = {r[0] for r in query(initial_db_path, "SELECT id FROM holds")}
        new_holds = [
            r
            for r in query(
                final_db_path,
                "SELECT h.id, h.status, h.pickup_branch_id, b.title, b.format FROM holds h "
                "JOIN books b ON b.id = h.book_id WHERE h.member_id = ?",
                (member_id,),
            )
            if r[0] not in initial_hold_ids
        ]
        if len(new_holds) != 1:
            return {"result": "others"}
        _, status, pickup, title, fmt = new_holds[0]
        if status not in ("waiting", "ready") or pickup != home_branch_id:
            return {"result": "others"}
        if title != "Project Hail Mary" or fmt != "audiobook":
            return {"result": "others"}
        # no other hold of hers may have been cancelled
        for hold_id, status in query(
            initial_db_path, "SELECT id, status FROM holds WHERE id != ?", (old[0][0],)
        ):
            row = query(final_db_path, "SELECT status FROM holds WHERE id = ?", (hold_id,))
            if len(row) != 1 or row[0][0] != status:
                return {"result": "others"}
        return {"result": "complete"}
    except Exception:
        return {"result": "others"}
