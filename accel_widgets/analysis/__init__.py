"""Reading results: each run against its baseline, the correctness guard, and the plain-language diagnosis."""
