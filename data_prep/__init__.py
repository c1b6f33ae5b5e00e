"""Raw text -> tokenized, packed MDS shards."""
