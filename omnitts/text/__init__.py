"""Text in: the tokenizer, splitting long texts, and a request's prompt embeddings."""
