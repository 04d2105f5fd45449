"""Confirmation of a message's final outcome to its source system (log, SOAP via zeep, HTTP), with retries."""

from openroute.confirmation.callbacks import (
    ConfirmationCallback,
    DefaultConfirmationCallback,
    DelegateConfirmationCallback,
    ExternalSystemConfirmation,
)
from openroute.confirmation.channel import ChannelConfirmation
from openroute.confirmation.model import (
    BusinessErrorInfo,
    ConfirmationError,
    ConfirmationInfo,
    ConfirmationRequest,
    ConfirmationSendError,
    InvalidConfirmationError,
    ProcessReport,
)
from openroute.confirmation.policy import ConfirmationPolicy
from openroute.confirmation.requests import request_from_message
from openroute.confirmation.service import ConfirmationService
from openroute.confirmation.transports import HttpJsonConfirmation, SoapConfirmation

__all__ = [
    "BusinessErrorInfo",
    "ChannelConfirmation",
    "ConfirmationCallback",
    "ConfirmationError",
    "ConfirmationInfo",
    "ConfirmationPolicy",
    "ConfirmationRequest",
    "ConfirmationSendError",
    "ConfirmationService",
    "DefaultConfirmationCallback",
    "DelegateConfirmationCallback",
    "ExternalSystemConfirmation",
    "HttpJsonConfirmation",
    "InvalidConfirmationError",
    "ProcessReport",
    "SoapConfirmation",
    "request_from_message",
]
