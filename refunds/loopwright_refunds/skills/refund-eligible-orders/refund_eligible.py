# Refund each order in `orders` that is delivered and has something left to refund.
outcome = {}
for order_id in orders:
    order = get_order(order_id=order_id)
    if order["status"] != "delivered" or order["refundable"] == "0.00":
        outcome[order_id] = "not refundable: " + order["status"]
        continue
    try:
        refund = submit_refund(
            order_id=order_id,
            amount=order["refundable"],
            currency=order["currency"],
            reason="customer asked to refund each eligible order",
        )
        outcome[order_id] = refund["refund_id"]
    except Exception as refused:
        outcome[order_id] = "refused: " + str(refused)
outcome
