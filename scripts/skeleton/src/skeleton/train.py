"""`python -m skeleton.train [group=option] [key=value] ... [-m ...]`: the engine's training on
this project's conf/ (the engine's groups come through its search path)."""

from pathlib import Path

from repro.api import main

if __name__ == "__main__":
    main(Path(__file__).resolve().parents[2] / "conf")  # src/skeleton/train.py -> conf/
