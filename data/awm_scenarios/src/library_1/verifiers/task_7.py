def verify_task_completion(initial_db_path: str, final_db_path: str, final_answer: str | None = None) -> dict:
    """Task 7: Priya Raman's new reading list 'Spring Book Club 2025' with Pachinko and A Gentleman in Moscow."""
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
        if len(member) != 1:
            return {"result": "others"}
        member_id = member[0][0]
        name = "Spring Book Club 2025"
        if query(
            initial_db_path,
            "SELECT id FROM reading_lists WHERE member_id = ? AND name = ?",
            (member_id, name),
        ):
            return {"result": "others"}
        lists = query(
            final_db_path, "SELECT id FROM reading_lists WHERE member_id = ? AND name = ?", (member_id, name)
        )
        if len(lists) != 1:
            return {"result": "others"}
        titles = sorted(
            r[0]
            for r in query(
                final_db_path,
                "SELECT b.title FROM reading_list_items i JOIN books b ON b.id = i.book_id WHERE i.reading_list_id = ?",
                (lists[0][0],),
            )
        )
        if titles != ["A Gentleman in Moscow", "Pachinko"]:
            return {"result": "others"}
        # the member's existing lists stay as they were
        for list_id, count in query(
            initial_db_path,
            "SELECT r.id, COUNT(i.id) FROM reading_lists r LEFT JOIN reading_list_items i ON i.reading_list_id = r.id "
            "WHERE r.member_id = ? GROUP BY r.id",
            (member_id,),
        ):
            now = query(
                final_db_path, "SELECT COUNT(*) FROM reading_list_items WHERE reading_list_id = ?", (list_id,)
            )
            if not now or now[0][0] != count:
                return {"result": "others"}
        return {"result": "complete"}
    except Exception:
        return {"result": "others"}
