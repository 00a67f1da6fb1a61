"""ctxlake.serve"""
