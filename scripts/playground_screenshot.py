"""docs/img/playground.png: the playground page racing lookahead against plain decoding on the
embedded default target (a headless Chromium; see scripts/playground_browser.py).

Run:  .venv/bin/python scripts/playground_screenshot.py [--output docs/img/playground.png]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from playground_browser import decode_on_page, missing, open_browser

import quickdraft
from quickdraft.serve import create_app
from quickdraft.serve.background import BackgroundServer

PROMPT = "Summarize: The cat sat on the mat. The cat was happy on the mat because the mat was warm."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", type=Path, default=Path("docs/img/playground.png"))
    args = parser.parse_args()
    if missing():
        raise SystemExit(missing())
    server = BackgroundServer(create_app(quickdraft.load(method="prompt-lookup", backend="native"), max_batch=4))
    driver = open_browser(1400, 1100)
    try:
        decode_on_page(driver, server.url, PROMPT, "lookahead", 48, race=True)
        args.output.parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(args.output))
        print(f"wrote {args.output}")
    finally:
        driver.quit()
        server.stop()


if __name__ == "__main__":
    main()
