from specfuzz.cli import run

run()
