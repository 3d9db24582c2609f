"""specfuzz.engines"""
