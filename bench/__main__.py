"""``python -m bench``: the operation benchmark (``--layout``: ``bench.layout``'s)."""

import sys

from bench.harness import main

if __name__ == "__main__":
    if "--layout" in sys.argv[1:]:
        from bench.layout import main as layout_main

        layout_main([a for a in sys.argv[1:] if a != "--layout"])
    else:
        main()
