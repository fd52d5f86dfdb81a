def verify_task_completion(initial_db_path: str, final_db_path: str, final_answer: str | None = None) -> dict:
    """Task 9: check in Daniel Brooks's late copy of 'Sapiens' and waive the new overdue fine (snow closure)."""
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
        member = query(initial_db_path, "SELECT id FROM members WHERE full_name = ?", ("Daniel Brooks",))
        if len(member) != 1:
            return {"result": "others"}
        member_id = member[0][0]
        loans = query(
            initial_db_path,
            "SELECT l.id, l.copy_id FROM loans l JOIN copies c ON c.id = l.copy_id JOIN books b ON b.id = c.book_id "
            "WHERE l.member_id = ? AND l.status = 'active' AND b.title LIKE 'Sapiens%'",
            (member_id,),
        )
        if len(loans) != 1:
            return {"result": "others"}
        loan_id, copy_id = loans[0]
        row = query(final_db_path, "SELECT status FROM loans WHERE id = ?", (loan_id,))
        if len(row) != 1 or row[0][0] != "returned":
            return {"result": "others"}
        copy = query(final_db_path, "SELECT status FROM copies WHERE id = ?", (copy_id,))
        if len(copy) != 1 or copy[0][0] not in ("available", "on_hold_shelf"):
            return {"result": "others"}
        initial_fine_ids = {r[0] for r in query(initial_db_path, "SELECT id FROM fines")}
        fines = [
            r
            for r in query(
                final_db_path,
                "SELECT id, status, waiver_reason, amount_paid FROM fines WHERE loan_id = ? AND reason = 'overdue'",
                (loan_id,),
            )
            if r[0] not in initial_fine_ids
        ]
        if len(fines) != 1:
            return {"result": "others"}
        _, status, waiver_reason, amount_paid = fines[0]
        if status != "waived" or "snow" not in (waiver_reason or "").lower() or amount_paid:
            return {"result": "others"}
        # nothing else of his was waived or paid
        for fine_id, status in query(
            initial_db_path, "SELECT id, status FROM fines WHERE member_id = ?", (member_id,)
        ):
            now = query(final_db_path, "SELECT status FROM fines WHERE id = ?", (fine_id,))
            if len(now) != 1 or now[0][0] != status:
                return {"result": "others"}
        return {"result": "complete"}
    except Exception:
        return {"result": "others"}
