"""specfuzz.fuzz"""
