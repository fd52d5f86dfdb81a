def verify_task_completion(initial_db_path: str, final_db_path: str, final_answer: str | None = None) -> dict:
    """Task 4: Marcus Oyelaran pays all his unpaid overdue fines in cash; his other fines are untouched."""
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
        unpaid = query(
            initial_db_path,
            "SELECT id, reason, amount, amount_paid FROM fines WHERE member_id = ? AND status = 'unpaid'",
            (member_id,),
        )
        overdue = [r for r in unpaid if r[1] == "overdue"]
        other = [r for r in unpaid if r[1] != "overdue"]
        if not overdue:
            return {"result": "others"}
        initial_payment_ids = {r[0] for r in query(initial_db_path, "SELECT id FROM payments")}
        new_payments = [
            r
            for r in query(
                final_db_path,
                "SELECT id, fine_id, amount, method FROM payments WHERE member_id = ?",
                (member_id,),
            )
            if r[0] not in initial_payment_ids
        ]
        for fine_id, _, amount, paid_before in overdue:
            row = query(final_db_path, "SELECT status, amount_paid FROM fines WHERE id = ?", (fine_id,))
            if len(row) != 1 or row[0][0] != "paid" or abs(row[0][1] - amount) > 0.005:
                return {"result": "others"}
            paid_now = [p for p in new_payments if p[1] == fine_id]
            if not paid_now or any(p[3] != "cash" for p in paid_now):
                return {"result": "others"}
            if abs(sum(p[2] for p in paid_now) - (amount - paid_before)) > 0.005:
                return {"result": "others"}
        for fine_id, _, _, paid_before in other:
            row = query(final_db_path, "SELECT status, amount_paid FROM fines WHERE id = ?", (fine_id,))
            if len(row) != 1 or row[0][0] != "unpaid" or abs(row[0][1] - paid_before) > 0.005:
                return {"result": "others"}
        overdue_ids = {r[0] for r in overdue}
        if any(p[1] not in overdue_ids for p in new_payments):
            return {"result": "others"}
        return {"result": "complete"}
    except Exception:
        return {"result": "others"}
