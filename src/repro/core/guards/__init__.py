"""What keeps files from others data (docs/security.md), beside `runs/trust.py`, which says
what a stored config may build: `folders` (no write through a link out of a run or sweep
folder), `network` (the tools that read such files stay offline), `text` (their text escaped
for the terminal and CSV cells)."""
