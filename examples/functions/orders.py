"""Example functions over rows of examples/data/orders.csv, for the dbscan and bundle_scan
walk-throughs. Each takes a batch of rows (objects of column values) and returns rows."""


def tally(rows: list[dict[str, object]]) -> list[dict[str, object]]:
    """Each order with the customer's name capitalised and its amount in cents."""
    return [
        {
            "id": row["id"],
            "customer": str(row["customer"]).title(),
            "cents": round(float(row["amount"]) * 100),  # type: ignore[arg-type]
            "country": row["country"],
        }
        for row in rows
    ]


def europe(rows: list[dict[str, object]]) -> list[dict[str, object]]:
    """The orders placed in Europe, with 20 % VAT added."""
    return [
        {**row, "with_vat_cents": round(int(row["cents"]) * 1.2)}  # type: ignore[call-overload]
        for row in rows
        if row["country"] in {"GB", "NL", "CH"}
    ]
