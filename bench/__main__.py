"""``python -m bench``: the operation benchmark."""

from bench.harness import main

if __name__ == "__main__":
    main()
