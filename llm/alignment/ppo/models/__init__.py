"""Pipeline-parallel wrappers of the policy and value models (model_pp.py), where PaddleNLP keeps them."""
