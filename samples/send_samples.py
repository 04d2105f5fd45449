"""Send the sample requests to a running ``openroute run`` and print its answers.

    python samples/send_samples.py [--base http://127.0.0.1:8080]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent


def main() -> None:
    """Send the sample SOAP and JSON requests to the server at ``--base`` and print each answer."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="http://127.0.0.1:8080")
    base = parser.parse_args().base
    soap = httpx.post(f"{base}/soap/crm", content=(HERE / "setCustomer.soap.xml").read_bytes(),
                      headers={"Content-Type": "text/xml; charset=utf-8", "SOAPAction": '""'})
    print("setCustomer (SOAP):", soap.status_code, soap.text)
    order = httpx.post(f"{base}/api/shop/createOrder", content=(HERE / "createOrder.json").read_bytes(),
                       headers={"Content-Type": "application/json", "X-Source-System": "SHOP"})
    print("createOrder (JSON):", order.status_code, order.text)


if __name__ == "__main__":
    main()
