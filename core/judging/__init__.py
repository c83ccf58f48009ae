"""Judging candidates: accuracy metrics, the judge, the strict FP16 check, the verdict."""
