def verify_task_completion(initial_db_path: str, final_db_path: str, final_answer: str | None = None) -> dict:
    """Task 2: renew every loan of Grace Liu that is eligible (fewer than 2 renewals, nobody waiting)."""
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
        member = query(initial_db_path, "SELECT id FROM members WHERE full_name = ?", ("Grace Liu",))
        if len(member) != 1:
            return {"result": "others"}
        member_id = member[0][0]
        loans = query(
            initial_db_path,
            "SELECT l.id, l.renewal_count, l.due_date, c.book_id FROM loans l JOIN copies c ON c.id = l.copy_id "
            "WHERE l.member_id = ? AND l.status = 'active'",
            (member_id,),
        )
        if not loans:
            return {"result": "others"}
        eligible = set()
        for loan_id, renewals, _, book_id in loans:
            waiting = query(
                initial_db_path,
                "SELECT COUNT(*) FROM holds WHERE book_id = ? AND status = 'waiting'",
                (book_id,),
            )
            if renewals < 2 and waiting and waiting[0][0] == 0:
                eligible.add(loan_id)
        if not eligible:
            return {"result": "others"}
        for loan_id, renewals, due_date, _ in loans:
            row = query(
                final_db_path, "SELECT renewal_count, due_date, status FROM loans WHERE id = ?", (loan_id,)
            )
            if len(row) != 1 or row[0][2] != "active":
                return {"result": "others"}
            final_renewals, final_due, _ = row[0]
            if loan_id in eligible:
                if final_renewals != renewals + 1 or not str(final_due) > str(due_date):
                    return {"result": "others"}
            elif final_renewals != renewals or str(final_due) != str(due_date):
                return {"result": "others"}
        # no other member's loan may have been renewed by mistake
        initial_other = dict(
            (r[0], (r[1], str(r[2])))
            for r in query(
                initial_db_path,
                "SELECT id, renewal_count, due_date FROM loans WHERE member_id != ?",
                (member_id,),
            )
        )
        for loan_id, renewals, due in query(
            final_db_path, "SELECT id, renewal_count, due_date FROM loans WHERE member_id != ?", (member_id,)
        ):
            if loan_id in initial_other and initial_other[loan_id] != (renewals, str(due)):
                return {"result": "others"}
        return {"result": "complete"}
    except Exception:
        return {"result": "others"}
