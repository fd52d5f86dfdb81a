"""Schema (gen_db) and sample rows (gen_sample) of the library_1 scenario.

Authored for echo_trl (Apache-2.0). The data is fictional: the members, barcodes, ISBNs and
card numbers are invented; book titles and authors are real-world facts used as catalog data.
The circulation clock of the scenario is pinned to 2025-03-14 10:30:00 (see app.py), and every
timestamp below is a fixed literal, so a database built from these rows is byte-for-byte
reproducible (no datetime('now')).
"""

from __future__ import annotations

TABLES: list[dict] = [
    {
        "name": "branches",
        "ddl": """CREATE TABLE branches (
    id INTEGER PRIMARY KEY,
    code TEXT UNIQUE NOT NULL,
    name TEXT UNIQUE NOT NULL,
    address TEXT NOT NULL,
    phone TEXT,
    opening_hours TEXT,
    created_at DATETIME NOT NULL DEFAULT CURRENT_TIMESTAMP
);""",
        "indexes": ["CREATE INDEX idx_branches_name ON branches(name);"],
    },
    {
        "name": "books",
        "ddl": """CREATE TABLE books (
    id INTEGER PRIMARY KEY,
    isbn TEXT UNIQUE NOT NULL,
    title TEXT NOT NULL,
    author TEXT NOT NULL,
    publisher TEXT,
    publication_year INTEGER,
    genre TEXT NOT NULL,
    format TEXT NOT NULL DEFAULT 'print' CHECK (format IN ('print', 'large_print', 'audiobook', 'board_book')),
    language TEXT NOT NULL DEFAULT 'en',
    loan_period_days INTEGER NOT NULL DEFAULT 21,
    summary TEXT,
    created_at DATETIME NOT NULL DEFAULT CURRENT_TIMESTAMP
);""",
        "indexes": [
            "CREATE INDEX idx_books_title ON books(title);",
            "CREATE INDEX idx_books_author ON books(author);",
            "CREATE INDEX idx_books_genre ON books(genre);",
        ],
    },
    {
        "name": "copies",
        "ddl": """CREATE TABLE copies (
    id INTEGER PRIMARY KEY,
    book_id INTEGER NOT NULL,
    branch_id INTEGER NOT NULL,
    barcode TEXT UNIQUE NOT NULL,
    shelf_location TEXT,
    status TEXT NOT NULL DEFAULT 'available' CHECK (status IN ('available', 'on_loan', 'on_hold_shelf', 'in_repair', 'lost')),
    acquired_on DATE,
    FOREIGN KEY (book_id) REFERENCES books(id) ON DELETE CASCADE,
    FOREIGN KEY (branch_id) REFERENCES branches(id)
);""",
        "indexes": [
            "CREATE INDEX idx_copies_book_id ON copies(book_id);",
            "CREATE INDEX idx_copies_branch_status ON copies(branch_id, status);",
        ],
    },
    {
        "name": "members",
        "ddl": """CREATE TABLE members (
    id INTEGER PRIMARY KEY,
    card_number TEXT UNIQUE NOT NULL,
    full_name TEXT NOT NULL,
    email TEXT UNIQUE,
    phone TEXT,
    home_branch_id INTEGER NOT NULL,
    membership_type TEXT NOT NULL DEFAULT 'adult' CHECK (membership_type IN ('adult', 'senior', 'child', 'staff')),
    status TEXT NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'expired', 'suspended')),
    max_loans INTEGER NOT NULL DEFAULT 10,
    expires_on DATE NOT NULL,
    created_at DATETIME NOT NULL DEFAULT CURRENT_TIMESTAMP,
    updated_at DATETIME NOT NULL DEFAULT CURRENT_TIMESTAMP,
    FOREIGN KEY (home_branch_id) REFERENCES branches(id)
);""",
        "indexes": [
            "CREATE INDEX idx_members_full_name ON members(full_name);",
            "CREATE INDEX idx_members_home_branch_id ON members(home_branch_id);",
        ],
    },
    {
        "name": "loans",
        "ddl": """CREATE TABLE loans (
    id INTEGER PRIMARY KEY,
    copy_id INTEGER NOT NULL,
    member_id INTEGER NOT NULL,
    checkout_branch_id INTEGER NOT NULL,
    checked_out_at DATETIME NOT NULL,
    due_date DATE NOT NULL,
    returned_at DATETIME,
    renewal_count INTEGER NOT NULL DEFAULT 0,
    status TEXT NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'returned', 'lost')),
    FOREIGN KEY (copy_id) REFERENCES copies(id),
    FOREIGN KEY (member_id) REFERENCES members(id) ON DELETE CASCADE,
    FOREIGN KEY (checkout_branch_id) REFERENCES branches(id)
);""",
        "indexes": [
            "CREATE INDEX idx_loans_member_status ON loans(member_id, status);",
            "CREATE INDEX idx_loans_copy_id ON loans(copy_id);",
            "CREATE INDEX idx_loans_due_date ON loans(due_date);",
        ],
    },
    {
        "name": "holds",
        "ddl": """CREATE TABLE holds (
    id INTEGER PRIMARY KEY,
    book_id INTEGER NOT NULL,
    member_id INTEGER NOT NULL,
    pickup_branch_id INTEGER NOT NULL,
    status TEXT NOT NULL DEFAULT 'waiting' CHECK (status IN ('waiting', 'ready', 'fulfilled', 'cancelled', 'expired')),
    placed_at DATETIME NOT NULL,
    ready_copy_id INTEGER,
    pickup_by DATE,
    updated_at DATETIME NOT NULL DEFAULT CURRENT_TIMESTAMP,
    FOREIGN KEY (book_id) REFERENCES books(id),
    FOREIGN KEY (member_id) REFERENCES members(id) ON DELETE CASCADE,
    FOREIGN KEY (pickup_branch_id) REFERENCES branches(id),
    FOREIGN KEY (ready_copy_id) REFERENCES copies(id)
);""",
        "indexes": [
            "CREATE INDEX idx_holds_book_status ON holds(book_id, status, placed_at);",
            "CREATE INDEX idx_holds_member_id ON holds(member_id);",
        ],
    },
    {
        "name": "fines",
        "ddl": """CREATE TABLE fines (
    id INTEGER PRIMARY KEY,
    member_id INTEGER NOT NULL,
    loan_id INTEGER,
    reason TEXT NOT NULL CHECK (reason IN ('overdue', 'lost_item', 'damaged_item')),
    amount REAL NOT NULL CHECK (amount > 0),
    amount_paid REAL NOT NULL DEFAULT 0,
    status TEXT NOT NULL DEFAULT 'unpaid' CHECK (status IN ('unpaid', 'paid', 'waived')),
    assessed_at DATETIME NOT NULL,
    resolved_at DATETIME,
    waiver_reason TEXT,
    FOREIGN KEY (member_id) REFERENCES members(id) ON DELETE CASCADE,
    FOREIGN KEY (loan_id) REFERENCES loans(id)
);""",
        "indexes": ["CREATE INDEX idx_fines_member_status ON fines(member_id, status);"],
    },
    {
        "name": "payments",
        "ddl": """CREATE TABLE payments (
    id INTEGER PRIMARY KEY,
    fine_id INTEGER NOT NULL,
    member_id INTEGER NOT NULL,
    amount REAL NOT NULL CHECK (amount > 0),
    method TEXT NOT NULL CHECK (method IN ('cash', 'card', 'check')),
    paid_at DATETIME NOT NULL,
    FOREIGN KEY (fine_id) REFERENCES fines(id),
    FOREIGN KEY (member_id) REFERENCES members(id) ON DELETE CASCADE
);""",
        "indexes": ["CREATE INDEX idx_payments_fine_id ON payments(fine_id);"],
    },
    {
        "name": "reading_lists",
        "ddl": """CREATE TABLE reading_lists (
    id INTEGER PRIMARY KEY,
    member_id INTEGER NOT NULL,
    name TEXT NOT NULL,
    description TEXT,
    created_at DATETIME NOT NULL DEFAULT CURRENT_TIMESTAMP,
    updated_at DATETIME NOT NULL DEFAULT CURRENT_TIMESTAMP,
    FOREIGN KEY (member_id) REFERENCES members(id) ON DELETE CASCADE
);""",
        "indexes": ["CREATE UNIQUE INDEX idx_reading_lists_member_name ON reading_lists(member_id, name);"],
    },
    {
        "name": "reading_list_items",
        "ddl": """CREATE TABLE reading_list_items (
    id INTEGER PRIMARY KEY,
    reading_list_id INTEGER NOT NULL,
    book_id INTEGER NOT NULL,
    note TEXT,
    added_at DATETIME NOT NULL DEFAULT CURRENT_TIMESTAMP,
    FOREIGN KEY (reading_list_id) REFERENCES reading_lists(id) ON DELETE CASCADE,
    FOREIGN KEY (book_id) REFERENCES books(id)
);""",
        "indexes": [
            "CREATE UNIQUE INDEX idx_reading_list_items_list_book ON reading_list_items(reading_list_id, book_id);"
        ],
    },
]


def _sql(value: object) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int | float):
        return repr(value)
    return "'" + str(value).replace("'", "''") + "'"


def _inserts(table: str, columns: tuple[str, ...], rows: list[tuple]) -> list[str]:
    cols = ", ".join(columns)
    return [f"INSERT INTO {table} ({cols}) VALUES ({', '.join(_sql(v) for v in row)});" for row in rows]


def _isbn13(stem: str) -> str:
    """A valid ISBN-13 (checksum digit) for an invented 12-digit stem."""
    total = sum(int(d) * (1 if i % 2 == 0 else 3) for i, d in enumerate(stem))
    return stem + str((10 - total % 10) % 10)


BRANCHES = [
    (
        1,
        "CEN",
        "Central Library",
        "200 Elm Street, Maplewood",
        "(555) 240-1100",
        "Mon-Thu 9:00-20:00, Fri-Sat 9:00-18:00, Sun 12:00-17:00",
        "2019-04-01 09:00:00",
    ),
    (
        2,
        "RIV",
        "Riverside Branch",
        "48 Mill Race Road, Maplewood",
        "(555) 240-1200",
        "Tue-Sat 10:00-18:00",
        "2019-04-01 09:00:00",
    ),
    (
        3,
        "EGT",
        "Eastgate Branch",
        "1175 Eastgate Parkway, Maplewood",
        "(555) 240-1300",
        "Mon-Fri 10:00-19:00, Sat 10:00-16:00",
        "2021-09-15 09:00:00",
    ),
]

# id, title, author, publisher, year, genre, format, loan_period_days, summary
_BOOKS = [
    (
        1,
        "Project Hail Mary",
        "Andy Weir",
        "Ballantine Books",
        2021,
        "science fiction",
        "print",
        21,
        "A lone astronaut wakes with no memory aboard a ship sent to save Earth from a dimming sun.",
    ),
    (
        2,
        "Project Hail Mary",
        "Andy Weir",
        "Audible Studios",
        2021,
        "science fiction",
        "audiobook",
        14,
        "Unabridged audiobook edition, 16 hours 10 minutes.",
    ),
    (
        3,
        "The Overstory",
        "Richard Powers",
        "W. W. Norton",
        2018,
        "literary fiction",
        "print",
        21,
        "Nine strangers are drawn together by their connection to trees and a fight to save old-growth forest.",
    ),
    (
        4,
        "Circe",
        "Madeline Miller",
        "Little, Brown",
        2018,
        "fantasy",
        "print",
        21,
        "The witch of Aiaia tells her own story, from exile to confrontations with gods and heroes.",
    ),
    (
        5,
        "Circe",
        "Madeline Miller",
        "Thorndike Press",
        2018,
        "fantasy",
        "large_print",
        21,
        "Large print edition.",
    ),
    (
        6,
        "Braiding Sweetgrass",
        "Robin Wall Kimmerer",
        "Milkweed Editions",
        2013,
        "nature",
        "print",
        21,
        "Essays weaving Indigenous knowledge and plant science into a case for reciprocity with the land.",
    ),
    (
        7,
        "Pachinko",
        "Min Jin Lee",
        "Grand Central Publishing",
        2017,
        "historical fiction",
        "print",
        21,
        "Four generations of a Korean family make their lives in Japan across the twentieth century.",
    ),
    (
        8,
        "A Gentleman in Moscow",
        "Amor Towles",
        "Viking",
        2016,
        "historical fiction",
        "print",
        21,
        "A count sentenced to house arrest in a grand hotel finds a full life within its walls.",
    ),
    (
        9,
        "Sapiens: A Brief History of Humankind",
        "Yuval Noah Harari",
        "Harper",
        2015,
        "history",
        "print",
        21,
        "A sweeping account of how Homo sapiens came to dominate the planet.",
    ),
    (
        10,
        "The Name of the Wind",
        "Patrick Rothfuss",
        "DAW Books",
        2007,
        "fantasy",
        "print",
        21,
        "A legendary figure recounts his youth as an orphan, a student and a musician.",
    ),
    (
        11,
        "Educated",
        "Tara Westover",
        "Random House",
        2018,
        "memoir",
        "print",
        21,
        "A woman raised off the grid in Idaho teaches herself enough to reach university.",
    ),
    (
        12,
        "The Left Hand of Darkness",
        "Ursula K. Le Guin",
        "Ace Books",
        1969,
        "science fiction",
        "print",
        21,
        "An envoy to a wintry planet confronts a society without fixed gender.",
    ),
    (
        13,
        "Beloved",
        "Toni Morrison",
        "Alfred A. Knopf",
        1987,
        "literary fiction",
        "print",
        21,
        "A formerly enslaved woman in Ohio is haunted by the past she escaped.",
    ),
    (
        14,
        "The Very Hungry Caterpillar",
        "Eric Carle",
        "Philomel Books",
        1969,
        "children",
        "board_book",
        21,
        "A caterpillar eats its way through a week of food before becoming a butterfly.",
    ),
    (
        15,
        "The Body Keeps the Score",
        "Bessel van der Kolk",
        "Viking",
        2014,
        "psychology",
        "print",
        21,
        "How trauma reshapes body and brain, and approaches to recovery.",
    ),
    (
        16,
        "Station Eleven",
        "Emily St. John Mandel",
        "Knopf",
        2014,
        "science fiction",
        "print",
        21,
        "A traveling theater troupe performs Shakespeare in the years after a pandemic.",
    ),
    (
        17,
        "Station Eleven",
        "Emily St. John Mandel",
        "Random House Audio",
        2014,
        "science fiction",
        "audiobook",
        14,
        "Unabridged audiobook edition, 10 hours 49 minutes.",
    ),
    (
        18,
        "The Martian",
        "Andy Weir",
        "Crown",
        2014,
        "science fiction",
        "print",
        21,
        "An astronaut stranded on Mars engineers his survival one problem at a time.",
    ),
]
BOOKS = [
    (b[0], _isbn13(f"97819{b[0] * 7919 % 1000:03d}{b[0] * 37 % 10000:04d}"), *b[1:], "2020-01-06 08:00:00")
    for b in _BOOKS
]

# id, book_id, branch_id, barcode, shelf_location, status, acquired_on
COPIES = [
    (1, 1, 1, "31994002104101", "FIC WEI", "on_loan", "2021-06-02"),
    (2, 1, 1, "31994002104119", "FIC WEI", "available", "2021-06-02"),
    (3, 1, 2, "31994002104127", "FIC WEI", "available", "2021-06-09"),
    (4, 1, 3, "31994002104135", "FIC WEI", "in_repair", "2021-09-20"),
    (5, 2, 1, "31994002104143", "AUDIO WEI", "available", "2021-07-14"),
    (6, 3, 1, "31994002104150", "FIC POW", "on_loan", "2019-05-20"),
    (7, 3, 2, "31994002104168", "FIC POW", "on_loan", "2019-05-20"),
    (8, 4, 1, "31994002104176", "FIC MIL", "on_loan", "2018-05-01"),
    (9, 4, 2, "31994002104184", "FIC MIL", "on_loan", "2018-05-01"),
    (10, 4, 3, "31994002104192", "FIC MIL", "in_repair", "2021-09-20"),
    (11, 5, 2, "31994002104200", "LP FIC MIL", "available", "2019-02-11"),
    (12, 6, 1, "31994002104218", "581.6 KIM", "available", "2020-03-03"),
    (13, 6, 3, "31994002104226", "581.6 KIM", "available", "2021-09-20"),
    (14, 7, 1, "31994002104234", "FIC LEE", "available", "2019-01-15"),
    (15, 7, 2, "31994002104242", "FIC LEE", "available", "2019-01-15"),
    (16, 8, 1, "31994002104259", "FIC TOW", "available", "2019-01-15"),
    (17, 8, 2, "31994002104267", "FIC TOW", "lost", "2019-01-15"),
    (18, 9, 2, "31994002104275", "909 HAR", "on_loan", "2019-08-30"),
    (19, 9, 3, "31994002104283", "909 HAR", "on_loan", "2021-09-20"),
    (20, 10, 1, "31994002104291", "FIC ROT", "on_loan", "2019-10-10"),
    (21, 10, 2, "31994002104309", "FIC ROT", "available", "2019-10-10"),
    (22, 11, 1, "31994002104317", "B WES", "on_loan", "2019-03-12"),
    (23, 11, 3, "31994002104325", "B WES", "available", "2021-09-20"),
    (24, 12, 1, "31994002104333", "SF LEG", "on_loan", "2019-06-18"),
    (25, 13, 2, "31994002104341", "FIC MOR", "available", "2019-06-18"),
    (26, 14, 3, "31994002104358", "J BOARD CAR", "on_loan", "2021-09-20"),
    (27, 14, 3, "31994002104366", "J BOARD CAR", "available", "2021-09-20"),
    (28, 15, 1, "31994002104374", "616.85 VAN", "available", "2020-02-05"),
    (29, 15, 2, "31994002104382", "616.85 VAN", "on_hold_shelf", "2020-02-05"),
    (30, 16, 1, "31994002104390", "SF MAN", "on_loan", "2020-04-22"),
    (31, 16, 3, "31994002104408", "SF MAN", "available", "2021-09-20"),
    (32, 17, 2, "31994002104416", "AUDIO MAN", "available", "2020-04-22"),
    (33, 18, 3, "31994002104424", "SF WEI", "available", "2021-09-20"),
]

# id, card_number, full_name, email, phone, home_branch_id, membership_type, status, max_loans,
# expires_on, created_at, updated_at
MEMBERS = [
    (
        1,
        "21190004512",
        "Priya Raman",
        "priya.raman@example.net",
        "(555) 318-4410",
        1,
        "adult",
        "active",
        10,
        "2026-01-31",
        "2022-01-31 14:05:00",
        "2025-01-31 11:20:00",
    ),
    (
        2,
        "21190004873",
        "Marcus Oyelaran",
        "m.oyelaran@example.com",
        "(555) 318-9032",
        2,
        "adult",
        "active",
        10,
        "2025-11-30",
        "2020-11-30 16:42:00",
        "2024-11-29 10:02:00",
    ),
    (
        3,
        "21190003390",
        "Helen Kowalczyk",
        "helen.kowalczyk@example.org",
        "(555) 240-7781",
        2,
        "senior",
        "active",
        15,
        "2025-08-15",
        "2016-08-15 10:10:00",
        "2024-08-14 15:30:00",
    ),
    (
        4,
        "21190005127",
        "Grace Liu",
        "grace.liu@example.com",
        "(555) 318-6624",
        1,
        "adult",
        "active",
        10,
        "2025-12-01",
        "2023-12-01 12:00:00",
        "2024-12-01 09:45:00",
    ),
    (
        5,
        "21190005561",
        "Aiko Tanaka",
        "aiko.tanaka@example.net",
        "(555) 318-2098",
        1,
        "adult",
        "expired",
        10,
        "2025-02-28",
        "2023-02-28 17:25:00",
        "2024-02-27 13:00:00",
    ),
    (
        6,
        "21190004209",
        "Samuel Adeyemi",
        "samuel.a@example.org",
        "(555) 201-7745",
        1,
        "adult",
        "active",
        10,
        "2025-10-05",
        "2021-10-05 11:11:00",
        "2024-10-04 16:50:00",
    ),
    (
        7,
        "21190006014",
        "Tomás Ferreira",
        "ferreira.family@example.com",
        "(555) 318-5506",
        3,
        "child",
        "active",
        5,
        "2026-06-30",
        "2023-06-30 15:00:00",
        "2024-06-30 15:05:00",
    ),
    (
        8,
        "21190005892",
        "Daniel Brooks",
        "dbrooks@example.net",
        "(555) 240-3317",
        3,
        "adult",
        "active",
        10,
        "2025-09-09",
        "2022-09-09 18:30:00",
        "2024-09-09 18:35:00",
    ),
    (
        9,
        "21190002741",
        "Rosa Delgado",
        "rosa.delgado@example.com",
        "(555) 201-4478",
        2,
        "adult",
        "suspended",
        10,
        "2025-07-19",
        "2018-07-19 10:00:00",
        "2025-01-20 09:00:00",
    ),
    (
        10,
        "21190004655",
        "Kwame Mensah",
        "kwame.mensah@example.org",
        "(555) 318-7719",
        2,
        "adult",
        "active",
        10,
        "2026-02-14",
        "2021-02-14 13:40:00",
        "2025-02-14 13:45:00",
    ),
]

# id, copy_id, member_id, checkout_branch_id, checked_out_at, due_date, returned_at, renewal_count, status
LOANS = [
    # Priya: one active loan
    (1, 22, 1, 1, "2025-03-04 17:12:00", "2025-03-25", None, 0, "active"),
    # Marcus: The Overstory is 13 days overdue; Sapiens is current
    (2, 7, 2, 2, "2025-02-08 11:03:00", "2025-03-01", None, 0, "active"),
    (3, 18, 2, 2, "2025-02-27 15:47:00", "2025-03-20", None, 0, "active"),
    # Grace: four active loans with different renewal eligibility
    (4, 30, 4, 1, "2025-02-25 12:30:00", "2025-03-18", None, 0, "active"),
    (5, 24, 4, 1, "2025-01-10 12:31:00", "2025-03-21", None, 2, "active"),
    (6, 8, 4, 1, "2025-02-24 12:32:00", "2025-03-17", None, 0, "active"),
    (7, 20, 4, 1, "2025-02-11 18:05:00", "2025-03-24", None, 1, "active"),
    # Tomás
    (8, 26, 7, 3, "2025-03-08 10:45:00", "2025-03-29", None, 0, "active"),
    # Daniel: Sapiens is 3 days overdue
    (9, 19, 8, 3, "2025-02-18 17:55:00", "2025-03-11", None, 0, "active"),
    # Kwame
    (10, 1, 10, 1, "2025-03-07 09:20:00", "2025-03-28", None, 0, "active"),
    (11, 6, 10, 1, "2025-03-07 09:21:00", "2025-03-28", None, 0, "active"),
    (12, 9, 10, 2, "2025-03-01 14:10:00", "2025-03-22", None, 0, "active"),
    # history
    (13, 25, 2, 2, "2025-01-20 16:00:00", "2025-02-10", "2025-02-24 10:15:00", 0, "returned"),
    (14, 33, 2, 3, "2025-01-30 12:00:00", "2025-02-20", "2025-02-25 18:40:00", 0, "returned"),
    (15, 15, 2, 2, "2024-12-12 11:30:00", "2025-01-02", "2025-01-02 17:05:00", 0, "returned"),
    (16, 14, 1, 1, "2025-01-06 13:00:00", "2025-01-27", "2025-01-24 12:10:00", 0, "returned"),
    (17, 17, 9, 2, "2024-10-02 15:15:00", "2024-10-23", None, 1, "lost"),
    (18, 12, 8, 1, "2024-11-04 10:00:00", "2024-11-25", "2024-12-05 09:30:00", 0, "returned"),
    (19, 16, 3, 1, "2024-12-02 11:00:00", "2024-12-23", "2024-12-30 14:20:00", 0, "returned"),
]

# id, book_id, member_id, pickup_branch_id, status, placed_at, ready_copy_id, pickup_by, updated_at
HOLDS = [
    (1, 4, 6, 1, "waiting", "2025-03-02 09:15:00", None, None, "2025-03-02 09:15:00"),
    (2, 3, 3, 2, "waiting", "2025-03-05 16:40:00", None, None, "2025-03-05 16:40:00"),
    (3, 15, 10, 2, "ready", "2025-02-27 08:50:00", 29, "2025-03-19", "2025-03-12 11:00:00"),
    (4, 11, 1, 1, "fulfilled", "2025-02-20 19:02:00", 22, "2025-03-07", "2025-03-04 17:12:00"),
    (5, 14, 7, 3, "cancelled", "2025-02-10 10:00:00", None, None, "2025-02-14 12:00:00"),
]

# id, member_id, loan_id, reason, amount, amount_paid, status, assessed_at, resolved_at, waiver_reason
FINES = [
    (1, 2, 13, "overdue", 3.5, 0.0, "unpaid", "2025-02-24 10:15:00", None, None),
    (2, 2, 14, "overdue", 1.25, 0.0, "unpaid", "2025-02-25 18:40:00", None, None),
    (3, 2, 15, "damaged_item", 6.0, 0.0, "unpaid", "2025-01-02 17:05:00", None, None),
    (4, 9, 17, "lost_item", 24.99, 0.0, "unpaid", "2024-11-22 09:00:00", None, None),
    (5, 8, 18, "overdue", 2.5, 2.5, "paid", "2024-12-05 09:30:00", "2024-12-05 09:31:00", None),
    (
        6,
        3,
        19,
        "overdue",
        1.75,
        0.0,
        "waived",
        "2024-12-30 14:20:00",
        "2024-12-30 14:22:00",
        "Holiday closure on 2024-12-24 and 2024-12-25",
    ),
]

# id, fine_id, member_id, amount, method, paid_at
PAYMENTS = [
    (1, 5, 8, 2.5, "card", "2024-12-05 09:31:00"),
]

# id, member_id, name, description, created_at, updated_at
READING_LISTS = [
    (1, 1, "Favorites", "Books I would happily reread.", "2024-06-01 20:15:00", "2025-01-24 12:30:00"),
    (2, 7, "Bedtime stories", None, "2024-07-03 19:00:00", "2024-07-03 19:00:00"),
]

# id, reading_list_id, book_id, note, added_at
READING_LIST_ITEMS = [
    (1, 1, 13, "Reread for the spring seminar.", "2024-06-01 20:16:00"),
    (2, 1, 7, None, "2025-01-24 12:30:00"),
    (3, 2, 14, None, "2024-07-03 19:01:00"),
]

SAMPLES: list[dict] = [
    {
        "table_name": "branches",
        "reasoning": "Three branches of the Maplewood Public Library system (Central, Riverside, Eastgate) so tasks "
        "can distinguish checkout branch, pickup branch and home branch. Branch codes and opening hours give "
        "the list_branches tool realistic content.",
        "insert_statements": _inserts(
            "branches", ("id", "code", "name", "address", "phone", "opening_hours", "created_at"), BRANCHES
        ),
    },
    {
        "table_name": "books",
        "reasoning": "Eighteen catalog records. Some titles exist in several formats (print, audiobook, large print) "
        "with different loan periods so that choosing the right edition matters (Project Hail Mary, Circe, "
        "Station Eleven); two books share an author (Andy Weir) to make author searches return several hits.",
        "insert_statements": _inserts(
            "books",
            (
                "id",
                "isbn",
                "title",
                "author",
                "publisher",
                "publication_year",
                "genre",
                "format",
                "loan_period_days",
                "summary",
                "created_at",
            ),
            BOOKS,
        ),
    },
    {
        "table_name": "copies",
        "reasoning": "Physical items spread over the three branches with every status the circulation rules use: "
        "available, on_loan, on_hold_shelf (a ready hold), in_repair and lost. Statuses agree with the loans and "
        "holds tables (every on_loan copy has exactly one active loan).",
        "insert_statements": _inserts(
            "copies",
            ("id", "book_id", "branch_id", "barcode", "shelf_location", "status", "acquired_on"),
            COPIES,
        ),
    },
    {
        "table_name": "members",
        "reasoning": "Ten cardholders covering the task situations: an active adult with one loan (Priya), a member "
        "with overdue items and unpaid fines above the $10 borrowing block (Marcus), a senior with a waiting hold "
        "(Helen), a member whose loans differ in renewal eligibility (Grace), an expired card (Aiko), a member "
        "changing contact details (Samuel), a child card (Tomás), a member returning late (Daniel), a suspended "
        "card with a lost item (Rosa) and a heavy borrower with a ready hold (Kwame).",
        "insert_statements": _inserts(
            "members",
            (
                "id",
                "card_number",
                "full_name",
                "email",
                "phone",
                "home_branch_id",
                "membership_type",
                "status",
                "max_loans",
                "expires_on",
                "created_at",
                "updated_at",
            ),
            MEMBERS,
        ),
    },
    {
        "table_name": "loans",
        "reasoning": "Active loans (some overdue relative to the pinned clock 2025-03-14, some at the renewal limit) "
        "and returned/lost history that explains the existing fines.",
        "insert_statements": _inserts(
            "loans",
            (
                "id",
                "copy_id",
                "member_id",
                "checkout_branch_id",
                "checked_out_at",
                "due_date",
                "returned_at",
                "renewal_count",
                "status",
            ),
            LOANS,
        ),
    },
    {
        "table_name": "holds",
        "reasoning": "Waiting holds that block renewals and receive returned copies (Circe, The Overstory), a ready "
        "hold on the hold shelf, and fulfilled/cancelled history.",
        "insert_statements": _inserts(
            "holds",
            (
                "id",
                "book_id",
                "member_id",
                "pickup_branch_id",
                "status",
                "placed_at",
                "ready_copy_id",
                "pickup_by",
                "updated_at",
            ),
            HOLDS,
        ),
    },
    {
        "table_name": "fines",
        "reasoning": "Unpaid overdue and damage fines for Marcus (total $10.75, above the borrowing block), a lost "
        "item fine for the suspended member, and paid and waived fines as history.",
        "insert_statements": _inserts(
            "fines",
            (
                "id",
                "member_id",
                "loan_id",
                "reason",
                "amount",
                "amount_paid",
                "status",
                "assessed_at",
                "resolved_at",
                "waiver_reason",
            ),
            FINES,
        ),
    },
    {
        "table_name": "payments",
        "reasoning": "The card payment that settled Daniel's paid fine.",
        "insert_statements": _inserts(
            "payments", ("id", "fine_id", "member_id", "amount", "method", "paid_at"), PAYMENTS
        ),
    },
    {
        "table_name": "reading_lists",
        "reasoning": "Existing personal reading lists, so creating a new list must not collide with them.",
        "insert_statements": _inserts(
            "reading_lists",
            ("id", "member_id", "name", "description", "created_at", "updated_at"),
            READING_LISTS,
        ),
    },
    {
        "table_name": "reading_list_items",
        "reasoning": "Books already on the existing reading lists.",
        "insert_statements": _inserts(
            "reading_list_items", ("id", "reading_list_id", "book_id", "note", "added_at"), READING_LIST_ITEMS
        ),
    },
]
