pip install -e '.[flask]'   # from the checkout
flask --app app run         # on http://127.0.0.1:5000
