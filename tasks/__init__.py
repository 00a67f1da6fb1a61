"""ctxlake.tasks"""
