pip install -e '.[redis]'    # redis-py >= 5
