"""specfuzz.tablegen"""
