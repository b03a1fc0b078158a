"""Example functions over rows of examples/data/orders.csv, for the dbscan and bundle_scan
walk-throughs. Each takes a batch of rows (objects of column values) and returns rows."""

from typing import Any


def tally(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each order with the customer's name capitalised and its amount in cents."""
    return [
        {
            "id": row["id"],
            "customer": row["customer"].title(),
            "cents": round(row["amount"] * 100),
            "country": row["country"],
        }
        for row in rows
    ]


def europe(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The orders placed in Europe, with 20 % VAT added."""
    return [
        {**row, "with_vat_cents": round(row["cents"] * 1.2)}
        for row in rows
        if row["country"] in {"GB", "NL", "CH"}
    ]
