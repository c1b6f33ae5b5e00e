"""Prepare the demo corpus and train on it with a stop and an autoresume: ``make demo``."""
from data_prep.demo_corpus import write_demo_data, write_demo_task
from llmfoundry_ext.measure.demo import demo_yaml, train_demo

if __name__ == '__main__':
    raw = demo_yaml()
    write_demo_data(raw.variables.data_root, window=raw.max_seq_len)
    write_demo_task(raw.variables.data_root)
    train_demo(raw)
