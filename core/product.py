"""The product's name, as every page and the admin's header write it."""

PRODUCT_NAME = "Diagnosis agent"
