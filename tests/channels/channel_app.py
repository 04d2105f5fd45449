"""The application the channel tests serve with ``openroute run``: one route fed only by the channel ``crm-in``."""

from openroute.dsl import Application, route

app = Application(
    route("crm", "setCustomer").from_channel("crm-in").require(json="$.customer.id")
    .object_id(json="$.customer.id").process(lambda exchange: None)
)
