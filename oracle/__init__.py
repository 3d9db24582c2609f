"""specfuzz.oracle"""
