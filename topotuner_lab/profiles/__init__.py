"""Profile cards: schema and JSON (no torch), selection from a drift table, applying a card to a model, comparing
cards.
"""
