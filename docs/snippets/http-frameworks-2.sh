pip install -e '.[boto3,django]'   # from a checkout
