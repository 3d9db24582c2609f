"""specfuzz.strategies"""
