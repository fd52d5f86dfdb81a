import os
from datetime import date, datetime, timedelta
from typing import Annotated, Literal

from fastapi import Body, FastAPI, HTTPException, Path, Query
from pydantic import BaseModel, Field
from sqlalchemy import (
    Column,
    Date,
    DateTime,
    Float,
    ForeignKey,
    Integer,
    String,
    Text,
    create_engine,
    func,
    or_,
)
from sqlalchemy.orm import declarative_base, sessionmaker

database_url = os.getenv("DATABASE_PATH", "sqlite:///outputs/databases/library_1.db")
if "://" not in database_url:
    database_url = f"sqlite:///{database_url}"

# One line: the official AWM server and OpenEnv's rewrite every line holding this call to point at their database.
engine = create_engine(database_url, connect_args={"check_same_thread": False})
SessionLocal = sessionmaker(bind=engine, autoflush=False, autocommit=False)

Base = declarative_base()

# The circulation clock is pinned so that due dates, overdue days and fines are reproducible
# from one episode to the next. Override with LIBRARY_CLOCK (ISO 8601) if needed.
LIBRARY_CLOCK = datetime.fromisoformat(os.getenv("LIBRARY_CLOCK", "2025-03-14T10:30:00"))

OVERDUE_FINE_PER_DAY = 0.25
OVERDUE_FINE_CAP = 10.00
BORROWING_BLOCK_THRESHOLD = 10.00
MAX_RENEWALS = 2
HOLD_PICKUP_DAYS = 7


def now_utc() -> datetime:
    return LIBRARY_CLOCK


def today() -> date:
    return LIBRARY_CLOCK.date()


class Branch(Base):
    __tablename__ = "branches"
    id = Column(Integer, primary_key=True)
    code = Column(String, unique=True, nullable=False)
    name = Column(String, unique=True, nullable=False, index=True)
    address = Column(Text, nullable=False)
    phone = Column(String)
    opening_hours = Column(Text)
    created_at = Column(DateTime, default=now_utc)


class Book(Base):
    __tablename__ = "books"
    id = Column(Integer, primary_key=True)
    isbn = Column(String, unique=True, nullable=False)
    title = Column(Text, nullable=False, index=True)
    author = Column(Text, nullable=False, index=True)
    publisher = Column(Text)
    publication_year = Column(Integer)
    genre = Column(String, nullable=False, index=True)
    format = Column(String, nullable=False, default="print")
    language = Column(String, nullable=False, default="en")
    loan_period_days = Column(Integer, nullable=False, default=21)
    summary = Column(Text)
    created_at = Column(DateTime, default=now_utc)


class Copy(Base):
    __tablename__ = "copies"
    id = Column(Integer, primary_key=True)
    book_id = Column(Integer, ForeignKey("books.id", ondelete="CASCADE"), nullable=False, index=True)
    branch_id = Column(Integer, ForeignKey("branches.id"), nullable=False)
    barcode = Column(String, unique=True, nullable=False)
    shelf_location = Column(String)
    status = Column(String, nullable=False, default="available")
    acquired_on = Column(Date)


class Member(Base):
    __tablename__ = "members"
    id = Column(Integer, primary_key=True)
    card_number = Column(String, unique=True, nullable=False)
    full_name = Column(Text, nullable=False, index=True)
    email = Column(String, unique=True)
    phone = Column(String)
    home_branch_id = Column(Integer, ForeignKey("branches.id"), nullable=False, index=True)
    membership_type = Column(String, nullable=False, default="adult")
    status = Column(String, nullable=False, default="active")
    max_loans = Column(Integer, nullable=False, default=10)
    expires_on = Column(Date, nullable=False)
    created_at = Column(DateTime, default=now_utc)
    updated_at = Column(DateTime, default=now_utc)


class Loan(Base):
    __tablename__ = "loans"
    id = Column(Integer, primary_key=True)
    copy_id = Column(Integer, ForeignKey("copies.id"), nullable=False, index=True)
    member_id = Column(Integer, ForeignKey("members.id", ondelete="CASCADE"), nullable=False)
    checkout_branch_id = Column(Integer, ForeignKey("branches.id"), nullable=False)
    checked_out_at = Column(DateTime, nullable=False)
    due_date = Column(Date, nullable=False, index=True)
    returned_at = Column(DateTime)
    renewal_count = Column(Integer, nullable=False, default=0)
    status = Column(String, nullable=False, default="active")


class Hold(Base):
    __tablename__ = "holds"
    id = Column(Integer, primary_key=True)
    book_id = Column(Integer, ForeignKey("books.id"), nullable=False)
    member_id = Column(Integer, ForeignKey("members.id", ondelete="CASCADE"), nullable=False, index=True)
    pickup_branch_id = Column(Integer, ForeignKey("branches.id"), nullable=False)
    status = Column(String, nullable=False, default="waiting")
    placed_at = Column(DateTime, nullable=False)
    ready_copy_id = Column(Integer, ForeignKey("copies.id"))
    pickup_by = Column(Date)
    updated_at = Column(DateTime, default=now_utc)


class Fine(Base):
    __tablename__ = "fines"
    id = Column(Integer, primary_key=True)
    member_id = Column(Integer, ForeignKey("members.id", ondelete="CASCADE"), nullable=False)
    loan_id = Column(Integer, ForeignKey("loans.id"))
    reason = Column(String, nullable=False)
    amount = Column(Float, nullable=False)
    amount_paid = Column(Float, nullable=False, default=0.0)
    status = Column(String, nullable=False, default="unpaid")
    assessed_at = Column(DateTime, nullable=False)
    resolved_at = Column(DateTime)
    waiver_reason = Column(Text)


class Payment(Base):
    __tablename__ = "payments"
    id = Column(Integer, primary_key=True)
    fine_id = Column(Integer, ForeignKey("fines.id"), nullable=False, index=True)
    member_id = Column(Integer, ForeignKey("members.id", ondelete="CASCADE"), nullable=False)
    amount = Column(Float, nullable=False)
    method = Column(String, nullable=False)
    paid_at = Column(DateTime, nullable=False)


class ReadingList(Base):
    __tablename__ = "reading_lists"
    id = Column(Integer, primary_key=True)
    member_id = Column(Integer, ForeignKey("members.id", ondelete="CASCADE"), nullable=False)
    name = Column(Text, nullable=False)
    description = Column(Text)
    created_at = Column(DateTime, default=now_utc)
    updated_at = Column(DateTime, default=now_utc)


class ReadingListItem(Base):
    __tablename__ = "reading_list_items"
    id = Column(Integer, primary_key=True)
    reading_list_id = Column(Integer, ForeignKey("reading_lists.id", ondelete="CASCADE"), nullable=False)
    book_id = Column(Integer, ForeignKey("books.id"), nullable=False)
    note = Column(Text)
    added_at = Column(DateTime, default=now_utc)


Base.metadata.create_all(engine)

app = FastAPI(
    title="Maplewood Public Library Circulation API",
    version="1.0.0",
    description="Staff circulation desk: catalog search, members, loans, holds, fines and reading lists.",
)


# ---------------------------------------------------------------------------
# Pydantic models
# ---------------------------------------------------------------------------


class BranchModel(BaseModel):
    id: int = Field(..., description="Branch ID.", examples=[1])
    code: str = Field(..., description="Short branch code.", examples=["CEN"])
    name: str = Field(..., description="Branch name.", examples=["Central Library"])
    address: str = Field(..., description="Street address.", examples=["200 Elm Street, Maplewood"])
    phone: str | None = Field(None, description="Branch phone number.", examples=["(555) 240-1100"])
    opening_hours: str | None = Field(None, description="Opening hours.", examples=["Tue-Sat 10:00-18:00"])


class BranchListResponse(BaseModel):
    branches: list[BranchModel] = Field(..., description="All library branches.")


class BranchAvailabilityModel(BaseModel):
    branch_id: int = Field(..., description="Branch ID.", examples=[1])
    branch_name: str = Field(..., description="Branch name.", examples=["Central Library"])
    total_copies: int = Field(..., description="Copies of this edition held at the branch.", examples=[2])
    available_copies: int = Field(..., description="Copies on the shelf and free to check out.", examples=[1])


class BookSummaryModel(BaseModel):
    id: int = Field(..., description="Book (catalog record) ID.", examples=[1])
    isbn: str = Field(..., description="ISBN-13 of this edition.", examples=["9781907919002"])
    title: str = Field(..., description="Title.", examples=["Project Hail Mary"])
    author: str = Field(..., description="Author.", examples=["Andy Weir"])
    format: str = Field(
        ..., description="Edition format: print, large_print, audiobook or board_book.", examples=["print"]
    )
    genre: str = Field(..., description="Genre.", examples=["science fiction"])
    publication_year: int | None = Field(None, description="Year of publication.", examples=[2021])
    loan_period_days: int = Field(..., description="Loan period for this edition in days.", examples=[21])
    total_copies: int = Field(
        ..., description="Copies owned across all branches (lost copies excluded).", examples=[4]
    )
    available_copies: int = Field(
        ..., description="Copies available to check out across all branches.", examples=[2]
    )
    holds_waiting: int = Field(
        ..., description="Members waiting in the hold queue for this edition.", examples=[0]
    )
    availability: list[BranchAvailabilityModel] = Field(..., description="Per-branch availability.")


class BookSearchResponse(BaseModel):
    total: int = Field(..., description="Number of matching catalog records before pagination.", examples=[2])
    books: list[BookSummaryModel] = Field(..., description="Matching catalog records.")


class CopyModel(BaseModel):
    copy_id: int = Field(..., description="Copy (item) ID.", examples=[2])
    barcode: str = Field(
        ..., description="14-digit item barcode printed on the copy.", examples=["31994002104119"]
    )
    branch_id: int = Field(..., description="Branch that owns the copy.", examples=[1])
    branch_name: str = Field(..., description="Name of the owning branch.", examples=["Central Library"])
    shelf_location: str | None = Field(
        None, description="Call number / shelf location.", examples=["FIC WEI"]
    )
    status: str = Field(
        ..., description="available, on_loan, on_hold_shelf, in_repair or lost.", examples=["available"]
    )
    due_date: date | None = Field(
        None, description="Due date when the copy is on loan.", examples=["2025-03-28"]
    )


class BookDetailModel(BaseModel):
    id: int = Field(..., description="Book ID.", examples=[1])
    isbn: str = Field(..., description="ISBN-13.", examples=["9781907919002"])
    title: str = Field(..., description="Title.", examples=["Project Hail Mary"])
    author: str = Field(..., description="Author.", examples=["Andy Weir"])
    publisher: str | None = Field(None, description="Publisher.", examples=["Ballantine Books"])
    publication_year: int | None = Field(None, description="Year of publication.", examples=[2021])
    genre: str = Field(..., description="Genre.", examples=["science fiction"])
    format: str = Field(..., description="Edition format.", examples=["print"])
    language: str = Field(..., description="Language code.", examples=["en"])
    loan_period_days: int = Field(..., description="Loan period in days.", examples=[21])
    summary: str | None = Field(None, description="Short summary.")
    holds_waiting: int = Field(..., description="Members waiting in the hold queue.", examples=[0])
    copies: list[CopyModel] = Field(..., description="Every copy of this edition with its status.")


class BookDetailResponse(BaseModel):
    book: BookDetailModel = Field(..., description="Catalog record with copies.")


class MemberSummaryModel(BaseModel):
    id: int = Field(..., description="Member ID.", examples=[1])
    card_number: str = Field(..., description="Library card number.", examples=["21190004512"])
    full_name: str = Field(..., description="Member name.", examples=["Priya Raman"])
    email: str | None = Field(None, description="Email address.", examples=["priya.raman@example.net"])
    phone: str | None = Field(None, description="Phone number.", examples=["(555) 318-4410"])
    home_branch_id: int = Field(..., description="Home branch ID.", examples=[1])
    home_branch_name: str = Field(..., description="Home branch name.", examples=["Central Library"])
    membership_type: str = Field(..., description="adult, senior, child or staff.", examples=["adult"])
    status: str = Field(..., description="active, expired or suspended.", examples=["active"])
    expires_on: date = Field(..., description="Card expiry date.", examples=["2026-01-31"])


class MemberSearchResponse(BaseModel):
    members: list[MemberSummaryModel] = Field(..., description="Matching members.")


class MemberAccountModel(BaseModel):
    active_loans: int = Field(..., description="Items currently checked out.", examples=[1])
    overdue_loans: int = Field(..., description="Checked-out items past their due date.", examples=[0])
    max_loans: int = Field(..., description="Maximum simultaneous loans for this card.", examples=[10])
    holds_waiting: int = Field(..., description="Holds waiting for a copy.", examples=[0])
    holds_ready: int = Field(..., description="Holds ready on the hold shelf.", examples=[0])
    unpaid_fines_total: float = Field(..., description="Outstanding fine balance in USD.", examples=[0.0])
    can_borrow: bool = Field(..., description="Whether the member may check out items now.", examples=[True])
    borrowing_blocks: list[str] = Field(..., description="Reasons the member cannot borrow, if any.")


class MemberDetailResponse(BaseModel):
    member: MemberSummaryModel = Field(..., description="Member record.")
    account: MemberAccountModel = Field(..., description="Circulation summary for the member.")


class MemberUpdateBody(BaseModel):
    email: str | None = Field(
        None, description="New email address; omit to keep.", examples=["new@example.com"]
    )
    phone: str | None = Field(
        None, description="New phone number; omit to keep.", examples=["(555) 318-2270"]
    )
    home_branch_id: int | None = Field(None, description="New home branch ID; omit to keep.", examples=[3])


class MemberUpdateResponse(BaseModel):
    member: MemberSummaryModel = Field(..., description="Updated member record.")
    updated_fields: list[str] = Field(..., description="Fields that changed.", examples=[["email"]])


class MembershipRenewalResponse(BaseModel):
    member: MemberSummaryModel = Field(..., description="Member record after renewal.")
    previous_expires_on: date = Field(..., description="Expiry date before renewal.", examples=["2025-02-28"])
    new_expires_on: date = Field(..., description="Expiry date after renewal.", examples=["2026-03-14"])


class LoanModel(BaseModel):
    loan_id: int = Field(..., description="Loan ID.", examples=[4])
    member_id: int = Field(..., description="Borrowing member ID.", examples=[4])
    copy_id: int = Field(..., description="Copy ID.", examples=[30])
    barcode: str = Field(..., description="Item barcode.", examples=["31994002104390"])
    book_id: int = Field(..., description="Book ID.", examples=[16])
    title: str = Field(..., description="Title.", examples=["Station Eleven"])
    author: str = Field(..., description="Author.", examples=["Emily St. John Mandel"])
    format: str = Field(..., description="Edition format.", examples=["print"])
    checkout_branch: str = Field(
        ..., description="Branch where the item was checked out.", examples=["Central Library"]
    )
    checked_out_at: datetime = Field(..., description="Checkout timestamp.", examples=["2025-02-25T12:30:00"])
    due_date: date = Field(..., description="Due date.", examples=["2025-03-18"])
    returned_at: datetime | None = Field(None, description="Return timestamp, if returned.")
    status: str = Field(..., description="active, returned or lost.", examples=["active"])
    days_overdue: int = Field(..., description="Days past the due date (0 if not overdue).", examples=[0])
    renewal_count: int = Field(..., description="Times this loan has been renewed.", examples=[0])
    renewals_remaining: int = Field(..., description="Renewals left before the limit.", examples=[2])
    renewable: bool = Field(..., description="Whether renew_loan would succeed now.", examples=[True])
    renewal_blocked_reason: str | None = Field(None, description="Why the loan cannot be renewed.")


class LoanListResponse(BaseModel):
    member_id: int = Field(..., description="Member ID.", examples=[4])
    status_filter: str = Field(..., description="Applied status filter.", examples=["active"])
    loans: list[LoanModel] = Field(..., description="Loans, most recent checkout first.")


class CheckoutBody(BaseModel):
    member_id: int = Field(..., description="ID of the borrowing member.", examples=[1])
    barcode: str = Field(..., description="Barcode of the copy to check out.", examples=["31994002104119"])


class CheckoutResponse(BaseModel):
    loan: LoanModel = Field(..., description="The new loan.")
    fulfilled_hold_id: int | None = Field(None, description="Hold fulfilled by this checkout, if any.")


class ReturnBody(BaseModel):
    barcode: str = Field(..., description="Barcode of the copy being returned.", examples=["31994002104168"])


class FineModel(BaseModel):
    fine_id: int = Field(..., description="Fine ID.", examples=[1])
    member_id: int = Field(..., description="Member ID.", examples=[2])
    loan_id: int | None = Field(None, description="Loan the fine relates to.", examples=[13])
    title: str | None = Field(None, description="Title of the related item.", examples=["Beloved"])
    reason: str = Field(..., description="overdue, lost_item or damaged_item.", examples=["overdue"])
    amount: float = Field(..., description="Fine amount in USD.", examples=[3.5])
    amount_paid: float = Field(..., description="Amount paid so far.", examples=[0.0])
    balance: float = Field(..., description="Outstanding balance.", examples=[3.5])
    status: str = Field(..., description="unpaid, paid or waived.", examples=["unpaid"])
    assessed_at: datetime = Field(..., description="When the fine was assessed.")
    resolved_at: datetime | None = Field(None, description="When the fine was paid off or waived.")
    waiver_reason: str | None = Field(None, description="Reason recorded for a waiver.")


class HoldModel(BaseModel):
    hold_id: int = Field(..., description="Hold ID.", examples=[2])
    member_id: int = Field(..., description="Member ID.", examples=[3])
    member_name: str = Field(..., description="Member name.", examples=["Helen Kowalczyk"])
    book_id: int = Field(..., description="Book ID.", examples=[3])
    title: str = Field(..., description="Title.", examples=["The Overstory"])
    format: str = Field(..., description="Edition format.", examples=["print"])
    pickup_branch_id: int = Field(..., description="Pickup branch ID.", examples=[2])
    pickup_branch: str = Field(..., description="Pickup branch name.", examples=["Riverside Branch"])
    status: str = Field(
        ..., description="waiting, ready, fulfilled, cancelled or expired.", examples=["waiting"]
    )
    queue_position: int | None = Field(
        None, description="Position in the hold queue while waiting.", examples=[1]
    )
    placed_at: datetime = Field(..., description="When the hold was placed.")
    ready_copy_barcode: str | None = Field(None, description="Barcode of the copy set aside, when ready.")
    pickup_by: date | None = Field(None, description="Last pickup day, when ready.")


class ReturnResponse(BaseModel):
    loan: LoanModel = Field(..., description="The closed loan.")
    fine_assessed: FineModel | None = Field(None, description="Overdue fine assessed on return, if any.")
    routed_to_hold: HoldModel | None = Field(
        None, description="Hold that the copy was set aside for, if any."
    )
    copy_status: str = Field(..., description="Status of the copy after check-in.", examples=["available"])


class RenewResponse(BaseModel):
    loan: LoanModel = Field(..., description="The renewed loan.")
    previous_due_date: date = Field(..., description="Due date before renewal.", examples=["2025-03-18"])


class OverdueLoanListResponse(BaseModel):
    as_of: date = Field(..., description="Date used for the overdue calculation.", examples=["2025-03-14"])
    loans: list[LoanModel] = Field(..., description="Overdue loans, most overdue first.")


class PlaceHoldBody(BaseModel):
    member_id: int = Field(..., description="Member placing the hold.", examples=[3])
    book_id: int = Field(..., description="Book (edition) to reserve.", examples=[4])
    pickup_branch_id: int = Field(
        ..., description="Branch where the member will collect the item.", examples=[2]
    )


class HoldResponse(BaseModel):
    hold: HoldModel = Field(..., description="Hold record.")


class HoldListResponse(BaseModel):
    member_id: int = Field(..., description="Member ID.", examples=[3])
    holds: list[HoldModel] = Field(..., description="Holds of the member, newest first.")


class FineListResponse(BaseModel):
    member_id: int = Field(..., description="Member ID.", examples=[2])
    status_filter: str = Field(..., description="Applied status filter.", examples=["unpaid"])
    fines: list[FineModel] = Field(..., description="Fines, oldest first.")
    outstanding_total: float = Field(
        ..., description="Unpaid balance over all the member's fines.", examples=[10.75]
    )


class PayFineBody(BaseModel):
    amount: float = Field(
        ..., gt=0, description="Amount paid in USD (at most the outstanding balance).", examples=[3.5]
    )
    method: Literal["cash", "card", "check"] = Field(
        ..., description="Payment method: cash, card or check.", examples=["cash"]
    )


class PaymentModel(BaseModel):
    payment_id: int = Field(..., description="Payment ID.", examples=[2])
    fine_id: int = Field(..., description="Fine ID.", examples=[1])
    amount: float = Field(..., description="Amount paid.", examples=[3.5])
    method: str = Field(..., description="Payment method.", examples=["cash"])
    paid_at: datetime = Field(..., description="Payment timestamp.")


class PayFineResponse(BaseModel):
    payment: PaymentModel = Field(..., description="Recorded payment.")
    fine: FineModel = Field(..., description="Fine after the payment.")
    member_outstanding_total: float = Field(
        ..., description="Member's remaining unpaid balance.", examples=[7.25]
    )


class WaiveFineBody(BaseModel):
    reason: str = Field(
        ...,
        min_length=3,
        description="Why the fine is waived (kept on the record).",
        examples=["Branch closed"],
    )


class WaiveFineResponse(BaseModel):
    fine: FineModel = Field(..., description="Fine after the waiver.")
    member_outstanding_total: float = Field(
        ..., description="Member's remaining unpaid balance.", examples=[0.0]
    )


class CreateReadingListBody(BaseModel):
    name: str = Field(
        ..., min_length=1, description="List name (unique per member).", examples=["Spring Book Club 2025"]
    )
    description: str | None = Field(None, description="Optional description.")


class ReadingListItemModel(BaseModel):
    item_id: int = Field(..., description="Reading list item ID.", examples=[4])
    book_id: int = Field(..., description="Book ID.", examples=[7])
    title: str = Field(..., description="Title.", examples=["Pachinko"])
    author: str = Field(..., description="Author.", examples=["Min Jin Lee"])
    note: str | None = Field(None, description="Member's note.")
    added_at: datetime = Field(..., description="When the book was added.")


class ReadingListModel(BaseModel):
    reading_list_id: int = Field(..., description="Reading list ID.", examples=[3])
    member_id: int = Field(..., description="Owner member ID.", examples=[1])
    name: str = Field(..., description="List name.", examples=["Spring Book Club 2025"])
    description: str | None = Field(None, description="Description.")
    created_at: datetime = Field(..., description="Creation timestamp.")
    updated_at: datetime = Field(..., description="Last update timestamp.")
    items: list[ReadingListItemModel] = Field(..., description="Books on the list, in the order added.")


class ReadingListResponse(BaseModel):
    reading_list: ReadingListModel = Field(..., description="Reading list with its items.")


class ReadingListListResponse(BaseModel):
    member_id: int = Field(..., description="Member ID.", examples=[1])
    reading_lists: list[ReadingListModel] = Field(..., description="The member's reading lists.")


class AddReadingListItemBody(BaseModel):
    book_id: int = Field(..., description="Book to add.", examples=[7])
    note: str | None = Field(None, description="Optional note.")


# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------


def money(value: float) -> float:
    return round(float(value) + 1e-9, 2)


def get_member_or_404(session, member_id: int) -> Member:
    member = session.query(Member).filter(Member.id == member_id).first()
    if member is None:
        raise HTTPException(status_code=404, detail=f"Member {member_id} not found")
    return member


def get_branch_or_404(session, branch_id: int) -> Branch:
    branch = session.query(Branch).filter(Branch.id == branch_id).first()
    if branch is None:
        raise HTTPException(status_code=404, detail=f"Branch {branch_id} not found")
    return branch


def get_book_or_404(session, book_id: int) -> Book:
    book = session.query(Book).filter(Book.id == book_id).first()
    if book is None:
        raise HTTPException(status_code=404, detail=f"Book {book_id} not found")
    return book


def waiting_holds_count(session, book_id: int) -> int:
    return session.query(Hold).filter(Hold.book_id == book_id, Hold.status == "waiting").count()


def outstanding_total(session, member_id: int) -> float:
    total = (
        session.query(func.coalesce(func.sum(Fine.amount - Fine.amount_paid), 0.0))
        .filter(Fine.member_id == member_id, Fine.status == "unpaid")
        .scalar()
    )
    return money(total or 0.0)


def member_model(session, member: Member) -> MemberSummaryModel:
    branch = session.query(Branch).filter(Branch.id == member.home_branch_id).first()
    return MemberSummaryModel(
        id=member.id,
        card_number=member.card_number,
        full_name=member.full_name,
        email=member.email,
        phone=member.phone,
        home_branch_id=member.home_branch_id,
        home_branch_name=branch.name if branch else "unknown",
        membership_type=member.membership_type,
        status=member.status,
        expires_on=member.expires_on,
    )


def borrowing_blocks(session, member: Member) -> list[str]:
    blocks: list[str] = []
    if member.status == "suspended":
        blocks.append("membership suspended")
    elif member.status == "expired" or member.expires_on < today():
        blocks.append(f"membership expired on {member.expires_on.isoformat()}")
    balance = outstanding_total(session, member.id)
    if balance >= BORROWING_BLOCK_THRESHOLD:
        blocks.append(f"unpaid fines of ${balance:.2f} (limit ${BORROWING_BLOCK_THRESHOLD:.2f})")
    active = session.query(Loan).filter(Loan.member_id == member.id, Loan.status == "active").count()
    if active >= member.max_loans:
        blocks.append(f"loan limit reached ({active}/{member.max_loans})")
    return blocks


def renewal_block(session, loan: Loan, book: Book) -> str | None:
    if loan.status != "active":
        return f"loan is {loan.status}"
    if loan.renewal_count >= MAX_RENEWALS:
        return f"maximum renewals ({MAX_RENEWALS}) reached"
    waiting = waiting_holds_count(session, book.id)
    if waiting:
        return f"{waiting} member(s) waiting in the hold queue for this title"
    return None


def loan_model(session, loan: Loan) -> LoanModel:
    copy = session.query(Copy).filter(Copy.id == loan.copy_id).first()
    book = session.query(Book).filter(Book.id == copy.book_id).first()
    branch = session.query(Branch).filter(Branch.id == loan.checkout_branch_id).first()
    days_overdue = 0
    if loan.status == "active":
        days_overdue = max(0, (today() - loan.due_date).days)
    elif loan.returned_at is not None:
        days_overdue = max(0, (loan.returned_at.date() - loan.due_date).days)
    block = renewal_block(session, loan, book)
    return LoanModel(
        loan_id=loan.id,
        member_id=loan.member_id,
        copy_id=copy.id,
        barcode=copy.barcode,
        book_id=book.id,
        title=book.title,
        author=book.author,
        format=book.format,
        checkout_branch=branch.name if branch else "unknown",
        checked_out_at=loan.checked_out_at,
        due_date=loan.due_date,
        returned_at=loan.returned_at,
        status=loan.status,
        days_overdue=days_overdue,
        renewal_count=loan.renewal_count,
        renewals_remaining=max(0, MAX_RENEWALS - loan.renewal_count),
        renewable=block is None,
        renewal_blocked_reason=block,
    )


def fine_model(session, fine: Fine) -> FineModel:
    title = None
    if fine.loan_id is not None:
        row = (
            session.query(Book.title)
            .join(Copy, Copy.book_id == Book.id)
            .join(Loan, Loan.copy_id == Copy.id)
            .filter(Loan.id == fine.loan_id)
            .first()
        )
        title = row[0] if row else None
    return FineModel(
        fine_id=fine.id,
        member_id=fine.member_id,
        loan_id=fine.loan_id,
        title=title,
        reason=fine.reason,
        amount=money(fine.amount),
        amount_paid=money(fine.amount_paid),
        balance=money(fine.amount - fine.amount_paid) if fine.status == "unpaid" else 0.0,
        status=fine.status,
        assessed_at=fine.assessed_at,
        resolved_at=fine.resolved_at,
        waiver_reason=fine.waiver_reason,
    )


def hold_model(session, hold: Hold) -> HoldModel:
    book = session.query(Book).filter(Book.id == hold.book_id).first()
    member = session.query(Member).filter(Member.id == hold.member_id).first()
    branch = session.query(Branch).filter(Branch.id == hold.pickup_branch_id).first()
    position = None
    if hold.status == "waiting":
        position = (
            session.query(Hold)
            .filter(Hold.book_id == hold.book_id, Hold.status == "waiting", Hold.placed_at <= hold.placed_at)
            .count()
        )
    barcode = None
    if hold.ready_copy_id is not None:
        copy = session.query(Copy).filter(Copy.id == hold.ready_copy_id).first()
        barcode = copy.barcode if copy else None
    return HoldModel(
        hold_id=hold.id,
        member_id=hold.member_id,
        member_name=member.full_name if member else "unknown",
        book_id=hold.book_id,
        title=book.title if book else "unknown",
        format=book.format if book else "unknown",
        pickup_branch_id=hold.pickup_branch_id,
        pickup_branch=branch.name if branch else "unknown",
        status=hold.status,
        queue_position=position,
        placed_at=hold.placed_at,
        ready_copy_barcode=barcode,
        pickup_by=hold.pickup_by,
    )


def reading_list_model(session, rl: ReadingList) -> ReadingListModel:
    rows = (
        session.query(ReadingListItem, Book)
        .join(Book, ReadingListItem.book_id == Book.id)
        .filter(ReadingListItem.reading_list_id == rl.id)
        .order_by(ReadingListItem.added_at.asc(), ReadingListItem.id.asc())
        .all()
    )
    return ReadingListModel(
        reading_list_id=rl.id,
        member_id=rl.member_id,
        name=rl.name,
        description=rl.description,
        created_at=rl.created_at,
        updated_at=rl.updated_at,
        items=[
            ReadingListItemModel(
                item_id=item.id,
                book_id=book.id,
                title=book.title,
                author=book.author,
                note=item.note,
                added_at=item.added_at,
            )
            for item, book in rows
        ],
    )


# ---------------------------------------------------------------------------
# Branches and catalog
# ---------------------------------------------------------------------------


@app.get(
    "/api/branches",
    response_model=BranchListResponse,
    summary="List library branches",
    description="List every branch of the library system with its ID, code, address, phone and opening hours.",
    tags=["branches"],
    operation_id="list_branches",
)
async def list_branches() -> BranchListResponse:
    with SessionLocal() as session:
        branches = session.query(Branch).order_by(Branch.id.asc()).all()
        return BranchListResponse(
            branches=[
                BranchModel(
                    id=b.id,
                    code=b.code,
                    name=b.name,
                    address=b.address,
                    phone=b.phone,
                    opening_hours=b.opening_hours,
                )
                for b in branches
            ]
        )


@app.get(
    "/api/books",
    response_model=BookSearchResponse,
    summary="Search the catalog",
    description="Search catalog records by title, author or ISBN (case-insensitive, partial match). Each edition "
    "(print, large print, audiobook, board book) is a separate record with per-branch copy availability.",
    tags=["catalog"],
    operation_id="search_books",
)
async def search_books(
    query: Annotated[
        str,
        Query(
            min_length=1,
            description="Words from the title, author name or ISBN.",
            examples=["Project Hail Mary"],
        ),
    ],
    format: Annotated[
        Literal["print", "large_print", "audiobook", "board_book"] | None,
        Query(description="Only return this edition format."),
    ] = None,
    genre: Annotated[
        str | None, Query(description="Only return this genre (exact, case-insensitive).")
    ] = None,
    available_only: Annotated[
        bool, Query(description="Only return editions with at least one available copy.")
    ] = False,
    branch_id: Annotated[
        int | None, Query(description="With available_only, require availability at this branch.")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=50, description="Maximum number of records to return.")] = 10,
    offset: Annotated[int, Query(ge=0, description="Records to skip for pagination.")] = 0,
) -> BookSearchResponse:
    with SessionLocal() as session:
        if branch_id is not None:
            get_branch_or_404(session, branch_id)
        pattern = f"%{query.strip()}%"
        q = session.query(Book).filter(
            or_(Book.title.ilike(pattern), Book.author.ilike(pattern), Book.isbn.ilike(pattern))
        )
        if format is not None:
            q = q.filter(Book.format == format)
        if genre is not None:
            q = q.filter(func.lower(Book.genre) == genre.lower())
        books = q.order_by(Book.title.asc(), Book.id.asc()).all()
        branches = session.query(Branch).order_by(Branch.id.asc()).all()
        results: list[BookSummaryModel] = []
        for book in books:
            copies = session.query(Copy).filter(Copy.book_id == book.id, Copy.status != "lost").all()
            availability = []
            for branch in branches:
                at_branch = [c for c in copies if c.branch_id == branch.id]
                if at_branch:
                    availability.append(
                        BranchAvailabilityModel(
                            branch_id=branch.id,
                            branch_name=branch.name,
                            total_copies=len(at_branch),
                            available_copies=sum(1 for c in at_branch if c.status == "available"),
                        )
                    )
            available = sum(1 for c in copies if c.status == "available")
            if available_only:
                if branch_id is not None:
                    if not any(a.branch_id == branch_id and a.available_copies > 0 for a in availability):
                        continue
                elif available == 0:
                    continue
            results.append(
                BookSummaryModel(
                    id=book.id,
                    isbn=book.isbn,
                    title=book.title,
                    author=book.author,
                    format=book.format,
                    genre=book.genre,
                    publication_year=book.publication_year,
                    loan_period_days=book.loan_period_days,
                    total_copies=len(copies),
                    available_copies=available,
                    holds_waiting=waiting_holds_count(session, book.id),
                    availability=availability,
                )
            )
        return BookSearchResponse(total=len(results), books=results[offset : offset + limit])


@app.get(
    "/api/books/{book_id}",
    response_model=BookDetailResponse,
    summary="Get a catalog record with its copies",
    description="Full catalog record for one edition, with every copy (barcode, branch, shelf location, status, "
    "due date when on loan) and the length of the hold queue.",
    tags=["catalog"],
    operation_id="get_book",
)
async def get_book(
    book_id: Annotated[int, Path(description="Book ID from search_books.", examples=[1])],
) -> BookDetailResponse:
    with SessionLocal() as session:
        book = get_book_or_404(session, book_id)
        rows = (
            session.query(Copy, Branch)
            .join(Branch, Copy.branch_id == Branch.id)
            .filter(Copy.book_id == book.id)
            .order_by(Copy.branch_id.asc(), Copy.id.asc())
            .all()
        )
        copies = []
        for copy, branch in rows:
            due = None
            if copy.status == "on_loan":
                loan = session.query(Loan).filter(Loan.copy_id == copy.id, Loan.status == "active").first()
                due = loan.due_date if loan else None
            copies.append(
                CopyModel(
                    copy_id=copy.id,
                    barcode=copy.barcode,
                    branch_id=branch.id,
                    branch_name=branch.name,
                    shelf_location=copy.shelf_location,
                    status=copy.status,
                    due_date=due,
                )
            )
        return BookDetailResponse(
            book=BookDetailModel(
                id=book.id,
                isbn=book.isbn,
                title=book.title,
                author=book.author,
                publisher=book.publisher,
                publication_year=book.publication_year,
                genre=book.genre,
                format=book.format,
                language=book.language,
                loan_period_days=book.loan_period_days,
                summary=book.summary,
                holds_waiting=waiting_holds_count(session, book.id),
                copies=copies,
            )
        )


# ---------------------------------------------------------------------------
# Members
# ---------------------------------------------------------------------------


@app.get(
    "/api/members",
    response_model=MemberSearchResponse,
    summary="Find members",
    description="Find library members by name, card number, email or phone (case-insensitive, partial match).",
    tags=["members"],
    operation_id="search_members",
)
async def search_members(
    query: Annotated[
        str,
        Query(
            min_length=2, description="Name, card number, email or phone fragment.", examples=["Priya Raman"]
        ),
    ],
    limit: Annotated[int, Query(ge=1, le=50, description="Maximum number of members to return.")] = 10,
) -> MemberSearchResponse:
    with SessionLocal() as session:
        pattern = f"%{query.strip()}%"
        members = (
            session.query(Member)
            .filter(
                or_(
                    Member.full_name.ilike(pattern),
                    Member.card_number.ilike(pattern),
                    Member.email.ilike(pattern),
                    Member.phone.ilike(pattern),
                )
            )
            .order_by(Member.full_name.asc())
            .limit(limit)
            .all()
        )
        return MemberSearchResponse(members=[member_model(session, m) for m in members])


@app.get(
    "/api/members/{member_id}",
    response_model=MemberDetailResponse,
    summary="Get a member's account",
    description="Member record plus a circulation summary: active and overdue loans, holds, unpaid fine balance "
    "and whether (and why not) the member can borrow.",
    tags=["members"],
    operation_id="get_member",
)
async def get_member(
    member_id: Annotated[int, Path(description="Member ID.", examples=[1])],
) -> MemberDetailResponse:
    with SessionLocal() as session:
        member = get_member_or_404(session, member_id)
        active = session.query(Loan).filter(Loan.member_id == member.id, Loan.status == "active").all()
        blocks = borrowing_blocks(session, member)
        account = MemberAccountModel(
            active_loans=len(active),
            overdue_loans=sum(1 for loan in active if loan.due_date < today()),
            max_loans=member.max_loans,
            holds_waiting=session.query(Hold)
            .filter(Hold.member_id == member.id, Hold.status == "waiting")
            .count(),
            holds_ready=session.query(Hold)
            .filter(Hold.member_id == member.id, Hold.status == "ready")
            .count(),
            unpaid_fines_total=outstanding_total(session, member.id),
            can_borrow=not blocks,
            borrowing_blocks=blocks,
        )
        return MemberDetailResponse(member=member_model(session, member), account=account)


@app.patch(
    "/api/members/{member_id}",
    response_model=MemberUpdateResponse,
    summary="Update a member's contact details",
    description="Change a member's email, phone number and/or home branch. Omitted fields are left unchanged.",
    tags=["members"],
    operation_id="update_member",
)
async def update_member(
    member_id: Annotated[int, Path(description="Member ID.", examples=[6])],
    body: Annotated[MemberUpdateBody, Body(description="Fields to change.")],
) -> MemberUpdateResponse:
    with SessionLocal() as session:
        member = get_member_or_404(session, member_id)
        changed: list[str] = []
        if body.email is not None:
            email = body.email.strip()
            if "@" not in email or "." not in email.split("@")[-1]:
                raise HTTPException(status_code=422, detail=f"Invalid email address: {body.email!r}")
            clash = session.query(Member).filter(Member.email == email, Member.id != member.id).first()
            if clash is not None:
                raise HTTPException(
                    status_code=409, detail=f"Email {email} is already used by another member"
                )
            if email != member.email:
                member.email = email
                changed.append("email")
        if body.phone is not None:
            phone = body.phone.strip()
            if sum(ch.isdigit() for ch in phone) < 7:
                raise HTTPException(status_code=422, detail=f"Invalid phone number: {body.phone!r}")
            if phone != member.phone:
                member.phone = phone
                changed.append("phone")
        if body.home_branch_id is not None:
            get_branch_or_404(session, body.home_branch_id)
            if body.home_branch_id != member.home_branch_id:
                member.home_branch_id = body.home_branch_id
                changed.append("home_branch_id")
        if not changed and body.email is None and body.phone is None and body.home_branch_id is None:
            raise HTTPException(
                status_code=400, detail="Provide at least one of email, phone, home_branch_id"
            )
        if changed:
            member.updated_at = now_utc()
            session.commit()
        return MemberUpdateResponse(member=member_model(session, member), updated_fields=changed)


@app.post(
    "/api/members/{member_id}/renew-membership",
    response_model=MembershipRenewalResponse,
    summary="Renew a library card",
    description="Extend a member's card by one year from today (or from the current expiry date if that is later) "
    "and reactivate an expired card. Suspended cards cannot be renewed at the desk.",
    tags=["members"],
    operation_id="renew_membership",
)
async def renew_membership(
    member_id: Annotated[int, Path(description="Member ID.", examples=[5])],
) -> MembershipRenewalResponse:
    with SessionLocal() as session:
        member = get_member_or_404(session, member_id)
        if member.status == "suspended":
            raise HTTPException(
                status_code=403,
                detail=f"Member {member_id} is suspended; a branch manager must review the account",
            )
        previous = member.expires_on
        base = max(previous, today())
        try:
            new_expiry = base.replace(year=base.year + 1)
        except ValueError:
            new_expiry = base + timedelta(days=365)
        member.expires_on = new_expiry
        member.status = "active"
        member.updated_at = now_utc()
        session.commit()
        return MembershipRenewalResponse(
            member=member_model(session, member), previous_expires_on=previous, new_expires_on=new_expiry
        )


# ---------------------------------------------------------------------------
# Loans
# ---------------------------------------------------------------------------


@app.get(
    "/api/members/{member_id}/loans",
    response_model=LoanListResponse,
    summary="List a member's loans",
    description="Loans of one member with barcode, title, due date, days overdue and renewal eligibility.",
    tags=["loans"],
    operation_id="list_member_loans",
)
async def list_member_loans(
    member_id: Annotated[int, Path(description="Member ID.", examples=[4])],
    status: Annotated[
        Literal["active", "returned", "lost", "all"], Query(description="Loan status filter.")
    ] = "active",
) -> LoanListResponse:
    with SessionLocal() as session:
        get_member_or_404(session, member_id)
        q = session.query(Loan).filter(Loan.member_id == member_id)
        if status != "all":
            q = q.filter(Loan.status == status)
        loans = q.order_by(Loan.checked_out_at.desc(), Loan.id.desc()).all()
        return LoanListResponse(
            member_id=member_id, status_filter=status, loans=[loan_model(session, loan) for loan in loans]
        )


@app.post(
    "/api/loans",
    response_model=CheckoutResponse,
    summary="Check out a copy to a member",
    description="Check out the copy with the given barcode to a member. The due date is today plus the edition's "
    "loan period. Fails if the member cannot borrow (expired or suspended card, unpaid fines of $10.00 or more, "
    "loan limit) or the copy is not available. A copy on the hold shelf can only go to the member it is held for.",
    tags=["loans"],
    operation_id="checkout_copy",
)
async def checkout_copy(
    body: Annotated[CheckoutBody, Body(description="Member and copy barcode.")],
) -> CheckoutResponse:
    with SessionLocal() as session:
        member = get_member_or_404(session, body.member_id)
        copy = session.query(Copy).filter(Copy.barcode == body.barcode.strip()).first()
        if copy is None:
            raise HTTPException(status_code=404, detail=f"No copy with barcode {body.barcode}")
        blocks = borrowing_blocks(session, member)
        if blocks:
            raise HTTPException(
                status_code=403, detail=f"Member {member.id} cannot borrow: " + "; ".join(blocks)
            )
        fulfilled = None
        if copy.status == "on_hold_shelf":
            hold = session.query(Hold).filter(Hold.ready_copy_id == copy.id, Hold.status == "ready").first()
            if hold is None or hold.member_id != member.id:
                raise HTTPException(
                    status_code=409, detail=f"Copy {copy.barcode} is on the hold shelf for another member"
                )
            hold.status = "fulfilled"
            hold.updated_at = now_utc()
            fulfilled = hold.id
        elif copy.status != "available":
            raise HTTPException(
                status_code=409, detail=f"Copy {copy.barcode} is not available (status: {copy.status})"
            )
        book = session.query(Book).filter(Book.id == copy.book_id).first()
        loan = Loan(
            copy_id=copy.id,
            member_id=member.id,
            checkout_branch_id=copy.branch_id,
            checked_out_at=now_utc(),
            due_date=today() + timedelta(days=book.loan_period_days),
            renewal_count=0,
            status="active",
        )
        copy.status = "on_loan"
        session.add(loan)
        session.commit()
        return CheckoutResponse(loan=loan_model(session, loan), fulfilled_hold_id=fulfilled)


@app.post(
    "/api/loans/return",
    response_model=ReturnResponse,
    summary="Check in a returned copy",
    description="Close the active loan of the copy with the given barcode. An overdue return is fined "
    "$0.25 per day late (capped at $10.00). If members are waiting for the title, the copy is set aside on the "
    "hold shelf for the first hold in the queue, otherwise it goes back on the shelf.",
    tags=["loans"],
    operation_id="return_copy",
)
async def return_copy(
    body: Annotated[ReturnBody, Body(description="Barcode of the returned copy.")],
) -> ReturnResponse:
    with SessionLocal() as session:
        copy = session.query(Copy).filter(Copy.barcode == body.barcode.strip()).first()
        if copy is None:
            raise HTTPException(status_code=404, detail=f"No copy with barcode {body.barcode}")
        loan = session.query(Loan).filter(Loan.copy_id == copy.id, Loan.status == "active").first()
        if loan is None:
            raise HTTPException(status_code=409, detail=f"Copy {copy.barcode} is not checked out")
        now = now_utc()
        loan.returned_at = now
        loan.status = "returned"
        fine = None
        days_late = (now.date() - loan.due_date).days
        if days_late > 0:
            fine = Fine(
                member_id=loan.member_id,
                loan_id=loan.id,
                reason="overdue",
                amount=money(min(OVERDUE_FINE_CAP, days_late * OVERDUE_FINE_PER_DAY)),
                amount_paid=0.0,
                status="unpaid",
                assessed_at=now,
            )
            session.add(fine)
        hold = (
            session.query(Hold)
            .filter(Hold.book_id == copy.book_id, Hold.status == "waiting")
            .order_by(Hold.placed_at.asc(), Hold.id.asc())
            .first()
        )
        if hold is not None:
            hold.status = "ready"
            hold.ready_copy_id = copy.id
            hold.pickup_by = now.date() + timedelta(days=HOLD_PICKUP_DAYS)
            hold.updated_at = now
            copy.status = "on_hold_shelf"
        else:
            copy.status = "available"
        session.commit()
        return ReturnResponse(
            loan=loan_model(session, loan),
            fine_assessed=fine_model(session, fine) if fine is not None else None,
            routed_to_hold=hold_model(session, hold) if hold is not None else None,
            copy_status=copy.status,
        )


@app.post(
    "/api/loans/{loan_id}/renew",
    response_model=RenewResponse,
    summary="Renew a loan",
    description="Renew an active loan: the new due date is today plus the edition's loan period. A loan can be "
    "renewed at most twice and not while other members are waiting in the hold queue for the title.",
    tags=["loans"],
    operation_id="renew_loan",
)
async def renew_loan(
    loan_id: Annotated[
        int, Path(description="Loan ID from list_member_loans (not the copy ID).", examples=[4])
    ],
) -> RenewResponse:
    with SessionLocal() as session:
        loan = session.query(Loan).filter(Loan.id == loan_id).first()
        if loan is None:
            raise HTTPException(status_code=404, detail=f"Loan {loan_id} not found")
        copy = session.query(Copy).filter(Copy.id == loan.copy_id).first()
        book = session.query(Book).filter(Book.id == copy.book_id).first()
        block = renewal_block(session, loan, book)
        if block is not None:
            raise HTTPException(
                status_code=409, detail=f"Loan {loan_id} ({book.title}) cannot be renewed: {block}"
            )
        previous = loan.due_date
        loan.due_date = max(previous, today() + timedelta(days=book.loan_period_days))
        loan.renewal_count = loan.renewal_count + 1
        session.commit()
        return RenewResponse(loan=loan_model(session, loan), previous_due_date=previous)


@app.get(
    "/api/loans/overdue",
    response_model=OverdueLoanListResponse,
    summary="List overdue loans",
    description="All active loans past their due date, optionally only those checked out at one branch.",
    tags=["loans"],
    operation_id="list_overdue_loans",
)
async def list_overdue_loans(
    branch_id: Annotated[int | None, Query(description="Only loans checked out at this branch.")] = None,
) -> OverdueLoanListResponse:
    with SessionLocal() as session:
        q = session.query(Loan).filter(Loan.status == "active", Loan.due_date < today())
        if branch_id is not None:
            get_branch_or_404(session, branch_id)
            q = q.filter(Loan.checkout_branch_id == branch_id)
        loans = q.order_by(Loan.due_date.asc(), Loan.id.asc()).all()
        return OverdueLoanListResponse(as_of=today(), loans=[loan_model(session, loan) for loan in loans])


# ---------------------------------------------------------------------------
# Holds
# ---------------------------------------------------------------------------


@app.post(
    "/api/holds",
    response_model=HoldResponse,
    summary="Place a hold",
    description="Reserve an edition for a member, to be collected at a pickup branch. The hold joins the end of "
    "the title's queue; the member is notified when a returned copy is set aside.",
    tags=["holds"],
    operation_id="place_hold",
)
async def place_hold(
    body: Annotated[PlaceHoldBody, Body(description="Member, edition and pickup branch.")],
) -> HoldResponse:
    with SessionLocal() as session:
        member = get_member_or_404(session, body.member_id)
        book = get_book_or_404(session, body.book_id)
        get_branch_or_404(session, body.pickup_branch_id)
        if member.status != "active" or member.expires_on < today():
            raise HTTPException(
                status_code=403, detail=f"Member {member.id} cannot place holds (status: {member.status})"
            )
        existing = (
            session.query(Hold)
            .filter(
                Hold.member_id == member.id, Hold.book_id == book.id, Hold.status.in_(["waiting", "ready"])
            )
            .first()
        )
        if existing is not None:
            raise HTTPException(
                status_code=409, detail=f"Member {member.id} already has hold {existing.id} on book {book.id}"
            )
        now = now_utc()
        hold = Hold(
            book_id=book.id,
            member_id=member.id,
            pickup_branch_id=body.pickup_branch_id,
            status="waiting",
            placed_at=now,
            updated_at=now,
        )
        session.add(hold)
        session.commit()
        return HoldResponse(hold=hold_model(session, hold))


@app.get(
    "/api/members/{member_id}/holds",
    response_model=HoldListResponse,
    summary="List a member's holds",
    description="Holds placed by a member (all statuses), with queue position for waiting holds.",
    tags=["holds"],
    operation_id="list_member_holds",
)
async def list_member_holds(
    member_id: Annotated[int, Path(description="Member ID.", examples=[3])],
) -> HoldListResponse:
    with SessionLocal() as session:
        get_member_or_404(session, member_id)
        holds = (
            session.query(Hold)
            .filter(Hold.member_id == member_id)
            .order_by(Hold.placed_at.desc(), Hold.id.desc())
            .all()
        )
        return HoldListResponse(member_id=member_id, holds=[hold_model(session, h) for h in holds])


@app.delete(
    "/api/holds/{hold_id}",
    response_model=HoldResponse,
    summary="Cancel a hold",
    description="Cancel a waiting or ready hold. A copy set aside for a ready hold goes back on the shelf.",
    tags=["holds"],
    operation_id="cancel_hold",
)
async def cancel_hold(
    hold_id: Annotated[int, Path(description="Hold ID from list_member_holds.", examples=[2])],
) -> HoldResponse:
    with SessionLocal() as session:
        hold = session.query(Hold).filter(Hold.id == hold_id).first()
        if hold is None:
            raise HTTPException(status_code=404, detail=f"Hold {hold_id} not found")
        if hold.status not in ("waiting", "ready"):
            raise HTTPException(status_code=409, detail=f"Hold {hold_id} is already {hold.status}")
        if hold.status == "ready" and hold.ready_copy_id is not None:
            copy = session.query(Copy).filter(Copy.id == hold.ready_copy_id).first()
            if copy is not None and copy.status == "on_hold_shelf":
                copy.status = "available"
        hold.status = "cancelled"
        hold.updated_at = now_utc()
        session.commit()
        return HoldResponse(hold=hold_model(session, hold))


# ---------------------------------------------------------------------------
# Fines
# ---------------------------------------------------------------------------


@app.get(
    "/api/members/{member_id}/fines",
    response_model=FineListResponse,
    summary="List a member's fines",
    description="Fines of one member with reason, related title, amount, amount paid and balance.",
    tags=["fines"],
    operation_id="list_member_fines",
)
async def list_member_fines(
    member_id: Annotated[int, Path(description="Member ID.", examples=[2])],
    status: Annotated[
        Literal["unpaid", "paid", "waived", "all"], Query(description="Fine status filter.")
    ] = "all",
) -> FineListResponse:
    with SessionLocal() as session:
        get_member_or_404(session, member_id)
        q = session.query(Fine).filter(Fine.member_id == member_id)
        if status != "all":
            q = q.filter(Fine.status == status)
        fines = q.order_by(Fine.assessed_at.asc(), Fine.id.asc()).all()
        return FineListResponse(
            member_id=member_id,
            status_filter=status,
            fines=[fine_model(session, f) for f in fines],
            outstanding_total=outstanding_total(session, member_id),
        )


@app.post(
    "/api/fines/{fine_id}/payments",
    response_model=PayFineResponse,
    summary="Record a fine payment",
    description="Record a payment against an unpaid fine. Partial payments are allowed; the fine is marked paid "
    "when its balance reaches zero. Paying more than the balance is rejected.",
    tags=["fines"],
    operation_id="pay_fine",
)
async def pay_fine(
    fine_id: Annotated[int, Path(description="Fine ID from list_member_fines.", examples=[1])],
    body: Annotated[PayFineBody, Body(description="Amount and payment method.")],
) -> PayFineResponse:
    with SessionLocal() as session:
        fine = session.query(Fine).filter(Fine.id == fine_id).first()
        if fine is None:
            raise HTTPException(status_code=404, detail=f"Fine {fine_id} not found")
        if fine.status != "unpaid":
            raise HTTPException(status_code=409, detail=f"Fine {fine_id} is already {fine.status}")
        balance = money(fine.amount - fine.amount_paid)
        amount = money(body.amount)
        if amount > balance:
            raise HTTPException(
                status_code=400,
                detail=f"Payment ${amount:.2f} exceeds the outstanding balance ${balance:.2f} of fine {fine_id}",
            )
        now = now_utc()
        payment = Payment(
            fine_id=fine.id, member_id=fine.member_id, amount=amount, method=body.method, paid_at=now
        )
        session.add(payment)
        fine.amount_paid = money(fine.amount_paid + amount)
        if money(fine.amount - fine.amount_paid) <= 0:
            fine.status = "paid"
            fine.resolved_at = now
        session.commit()
        return PayFineResponse(
            payment=PaymentModel(
                payment_id=payment.id,
                fine_id=fine.id,
                amount=amount,
                method=payment.method,
                paid_at=payment.paid_at,
            ),
            fine=fine_model(session, fine),
            member_outstanding_total=outstanding_total(session, fine.member_id),
        )


@app.post(
    "/api/fines/{fine_id}/waive",
    response_model=WaiveFineResponse,
    summary="Waive a fine",
    description="Waive the remaining balance of an unpaid fine, recording the reason on the member's account.",
    tags=["fines"],
    operation_id="waive_fine",
)
async def waive_fine(
    fine_id: Annotated[int, Path(description="Fine ID from list_member_fines.", examples=[7])],
    body: Annotated[WaiveFineBody, Body(description="Reason for the waiver.")],
) -> WaiveFineResponse:
    with SessionLocal() as session:
        fine = session.query(Fine).filter(Fine.id == fine_id).first()
        if fine is None:
            raise HTTPException(status_code=404, detail=f"Fine {fine_id} not found")
        if fine.status != "unpaid":
            raise HTTPException(status_code=409, detail=f"Fine {fine_id} is already {fine.status}")
        fine.status = "waived"
        fine.waiver_reason = body.reason.strip()
        fine.resolved_at = now_utc()
        session.commit()
        return WaiveFineResponse(
            fine=fine_model(session, fine),
            member_outstanding_total=outstanding_total(session, fine.member_id),
        )


# ---------------------------------------------------------------------------
# Reading lists
# ---------------------------------------------------------------------------


@app.post(
    "/api/members/{member_id}/reading-lists",
    response_model=ReadingListResponse,
    summary="Create a reading list",
    description="Create an empty personal reading list for a member. List names are unique per member.",
    tags=["reading_lists"],
    operation_id="create_reading_list",
)
async def create_reading_list(
    member_id: Annotated[int, Path(description="Member ID.", examples=[1])],
    body: Annotated[CreateReadingListBody, Body(description="Name and description of the list.")],
) -> ReadingListResponse:
    with SessionLocal() as session:
        get_member_or_404(session, member_id)
        name = body.name.strip()
        clash = (
            session.query(ReadingList)
            .filter(ReadingList.member_id == member_id, ReadingList.name == name)
            .first()
        )
        if clash is not None:
            raise HTTPException(
                status_code=409,
                detail=f"Member {member_id} already has a reading list named {name!r} (id {clash.id})",
            )
        now = now_utc()
        rl = ReadingList(
            member_id=member_id, name=name, description=body.description, created_at=now, updated_at=now
        )
        session.add(rl)
        session.commit()
        return ReadingListResponse(reading_list=reading_list_model(session, rl))


@app.post(
    "/api/reading-lists/{reading_list_id}/items",
    response_model=ReadingListResponse,
    summary="Add a book to a reading list",
    description="Add a catalog record to a reading list and return the whole list.",
    tags=["reading_lists"],
    operation_id="add_book_to_reading_list",
)
async def add_book_to_reading_list(
    reading_list_id: Annotated[int, Path(description="Reading list ID.", examples=[3])],
    body: Annotated[AddReadingListItemBody, Body(description="Book to add and an optional note.")],
) -> ReadingListResponse:
    with SessionLocal() as session:
        rl = session.query(ReadingList).filter(ReadingList.id == reading_list_id).first()
        if rl is None:
            raise HTTPException(status_code=404, detail=f"Reading list {reading_list_id} not found")
        book = get_book_or_404(session, body.book_id)
        dup = (
            session.query(ReadingListItem)
            .filter(ReadingListItem.reading_list_id == rl.id, ReadingListItem.book_id == book.id)
            .first()
        )
        if dup is not None:
            raise HTTPException(status_code=409, detail=f"Book {book.id} is already on reading list {rl.id}")
        now = now_utc()
        session.add(ReadingListItem(reading_list_id=rl.id, book_id=book.id, note=body.note, added_at=now))
        rl.updated_at = now
        session.commit()
        return ReadingListResponse(reading_list=reading_list_model(session, rl))


@app.get(
    "/api/members/{member_id}/reading-lists",
    response_model=ReadingListListResponse,
    summary="List a member's reading lists",
    description="All reading lists of a member with their books.",
    tags=["reading_lists"],
    operation_id="list_member_reading_lists",
)
async def list_member_reading_lists(
    member_id: Annotated[int, Path(description="Member ID.", examples=[1])],
) -> ReadingListListResponse:
    with SessionLocal() as session:
        get_member_or_404(session, member_id)
        lists = (
            session.query(ReadingList)
            .filter(ReadingList.member_id == member_id)
            .order_by(ReadingList.id.asc())
            .all()
        )
        return ReadingListListResponse(
            member_id=member_id, reading_lists=[reading_list_model(session, rl) for rl in lists]
        )


if __name__ == "__main__":
    import uvicorn

    host = os.getenv("HOST", "127.0.0.1")
    port = int(os.getenv("PORT", "8000"))
    uvicorn.run(app, host=host, port=port)
