"""The gateway's delivery book: order, two-phase ACK bookkeeping, replays."""

from gateway.book import DeliveryBook
from schemas.events import Acked, Deliver, Progress


def deliver(smuid: int, priority: int = 0, account: str = "bob") -> Deliver:
    return Deliver(account, smuid, "/t", f"C{smuid}", "alice", "g", 0, priority)


def drain(book: DeliveryBook, account: str = "bob") -> list[int]:
    taken = []
    while (d := book.take(account)) is not None:
        taken.append(d.smuid)
        book.acknowledged(account, d.smuid)
    return taken


def test_higher_priority_first_then_fifo_by_smuid():
    book = DeliveryBook()
    for smuid, priority in ((5, 0), (3, 0), (9, 2), (4, 1), (7, 2)):
        book.apply(deliver(smuid, priority))
    assert drain(book) == [7, 9, 4, 3, 5]


def test_in_flight_message_is_not_handed_out_twice_and_is_offered_again_after_release():
    book = DeliveryBook()
    book.apply(deliver(1)), book.apply(deliver(2))
    first = book.take("bob")
    assert first.smuid == 1 and book.take("bob").smuid == 2
    book.release("bob", 1)  # the connection went away before the ACK
    assert book.take("bob").smuid == 1


def test_replayed_delivery_of_an_acknowledged_message_is_ignored_until_the_job_confirms():
    book = DeliveryBook()
    book.apply(deliver(1))
    book.take("bob")
    book.acknowledged("bob", 1)
    assert book.apply(deliver(1)) is None  # the job replayed its batch
    assert book.take("bob") is None
    book.apply(Acked("bob", 1))
    assert book.pending_count("bob") == 0


def test_duplicate_deliver_records_do_not_duplicate_notifications():
    book = DeliveryBook()
    assert book.apply(deliver(1)) == "bob"
    assert book.apply(deliver(1)) is None
    assert drain(book) == [1]


def test_progress_records_the_jobs_command_offsets():
    book = DeliveryBook()
    book.apply(Progress({"0": 10}))
    book.apply(Progress({"0": 12}))
    assert book.commands_offsets == {"0": 12}
