"""Scenario description and tasks of library_1 (gen_scenario / gen_tasks). Authored for echo_trl."""

NAME = "library_1"
DB_PATH = "./outputs/databases/library_1.db"

DESCRIPTION = (
    "Maplewood Public Library is a three-branch public library system (Central Library, Riverside Branch and "
    "Eastgate Branch) whose circulation desk staff use an integrated library system to serve cardholders. Core "
    "entities are branches, catalog records (books, one record per edition: print, large print, audiobook or "
    "board book, each with its own loan period), physical copies identified by 14-digit barcodes and owned by a "
    "branch, members with library cards (adult, senior, child or staff; active, expired or suspended; with an "
    "expiry date, a home branch and a loan limit), loans, holds, fines, payments and personal reading lists. "
    "Staff search the catalog by title, author or ISBN and see per-branch availability; look members up by name, "
    "card number, email or phone; check copies out by barcode (blocked for expired or suspended cards, unpaid "
    "fines of $10.00 or more, or a full loan limit) and check them in. Returns after the due date are fined $0.25 "
    "per day, capped at $10.00. A returned copy whose title has a hold queue is set aside on the hold shelf for the "
    "first waiting member, who has seven days to collect it. Loans may be renewed at most twice, never while other "
    "members are waiting for the title. Staff place and cancel holds for a pickup branch, record cash, card or "
    "check payments against fines (partial payments allowed), waive fines with a recorded reason, renew expired "
    "cards for a year, update members' contact details and home branch, list overdue loans per branch, and manage "
    "members' reading lists."
)

TASKS = [
    "Priya Raman (card 21190004512) is at the Central Library desk and wants to borrow the print edition of "
    "'Project Hail Mary' by Andy Weir. Check out an available print copy held at the Central Library to her.",
    "Marcus Oyelaran has just handed back his copy of 'The Overstory'. Check it in (he is keeping his other loan) "
    "so that the overdue fine is recorded and the copy goes to the next member waiting for it.",
    "Grace Liu asked us to renew her loans. Renew every one of her current loans that is eligible for renewal and "
    "leave the others as they are.",
    "Place a hold on the regular print edition of 'Circe' by Madeline Miller for Helen Kowalczyk, to be picked "
    "up at the Riverside Branch.",
    "Marcus Oyelaran wants to pay all of his unpaid overdue fines in cash today. Record the payments, and do not "
    "touch any of his other fines.",
    "Samuel Adeyemi has moved. Update his account with the email samuel.adeyemi@fastmail.com and the phone "
    "number (555) 318-2270, and make the Eastgate Branch his home branch.",
    "Aiko Tanaka's library card has expired. Renew her membership, then check out a copy of 'Braiding "
    "Sweetgrass' from the Central Library to her.",
    "Create a reading list named 'Spring Book Club 2025' for Priya Raman and add 'Pachinko' and 'A Gentleman in "
    "Moscow' to it.",
    "Helen Kowalczyk no longer wants her hold on 'The Overstory'. Cancel it, and instead place a hold on the "
    "audiobook edition of 'Project Hail Mary' for pickup at her home branch.",
    "Daniel Brooks is returning 'Sapiens' three days late because the Eastgate Branch was closed for snow. Check "
    "the book in, then waive the overdue fine it generates with the reason 'Branch closed for snow'.",
]

# Train on tasks 0-7; hold out 8-9 (same tools and observation formats, new combinations) to measure how
# well the world model learned on the training tasks transfers.
SPLITS = {"train": [0, 1, 2, 3, 4, 5, 6, 7], "held_out": [8, 9]}
