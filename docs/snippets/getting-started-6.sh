pip install -e '.[boto3,flask]' waitress   # from a checkout
