"""ctxlake.schemas"""
