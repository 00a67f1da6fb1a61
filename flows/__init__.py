"""ctxlake.flows"""
