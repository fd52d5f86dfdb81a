def verify_task_completion(initial_db_path: str, final_db_path: str, final_answer: str | None = None) -> dict:
    """Task 1: check in Marcus Oyelaran's copy of 'The Overstory' (fine recorded, copy routed to the next hold)."""
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
        member = query(initial_db_path, "SELECT id FROM members WHERE full_name = ?", ("Marcus Oyelaran",))
        if len(member) != 1:
            return {"result": "others"}
        member_id = member[0][0]
        active = query(
            initial_db_path,
            "SELECT l.id, l.copy_id, b.id, b.title, l.due_date FROM loans l JOIN copies c ON c.id = l.copy_id "
            "JOIN books b ON b.id = c.book_id WHERE l.member_id = ? AND l.status = 'active'",
            (member_id,),
        )
        target = [r for r in active if r[3] == "The Overstory"]
        others = [r for r in active if r[3] != "The Overstory"]
        if len(target) != 1:
            return {"result": "others"}
        loan_id, copy_id, book_id, _, _ = target[0]

        final_loan = query(final_db_path, "SELECT status, returned_at FROM loans WHERE id = ?", (loan_id,))
        if len(final_loan) != 1 or final_loan[0][0] != "returned" or not final_loan[0][1]:
            return {"result": "others"}
        # his other loans must stay checked out
        for other in others:
            row = query(final_db_path, "SELECT status FROM loans WHERE id = ?", (other[0],))
            if len(row) != 1 or row[0][0] != "active":
                return {"result": "others"}
        # the loan was overdue on the clock date, so an overdue fine must exist for it
        fines = query(
            final_db_path,
            "SELECT amount FROM fines WHERE loan_id = ? AND reason = 'overdue' AND member_id = ?",
            (loan_id, member_id),
        )
        if len(fines) != 1 or fines[0][0] <= 0:
            return {"result": "others"}
        # the copy goes to the first waiting hold on the title, if there was one
        first_hold = query(
            initial_db_path,
            "SELECT id FROM holds WHERE book_id = ? AND status = 'waiting' ORDER BY placed_at, id LIMIT 1",
            (book_id,),
        )
        copy_status = query(final_db_path, "SELECT status FROM copies WHERE id = ?", (copy_id,))
        if len(copy_status) != 1:
            return {"result": "others"}
        if first_hold:
            hold = query(
                final_db_path, "SELECT status, ready_copy_id FROM holds WHERE id = ?", (first_hold[0][0],)
            )
            if len(hold) != 1 or hold[0][0] != "ready" or hold[0][1] != copy_id:
                return {"result": "others"}
            if copy_status[0][0] != "on_hold_shelf":
                return {"result": "others"}
        elif copy_status[0][0] != "available":
            return {"result": "others"}
        return {"result": "complete"}
    except Exception:
        return {"result": "others"}
