"""Confirmation of a message's final outcome to its source system (log, SOAP via zeep, HTTP), with retries."""

from confirmation.callbacks import (
    ConfirmationCallback,
    DefaultConfirmationCallback,
    DelegateConfirmationCallback,
    ExternalSystemConfirmation,
)
from confirmation.model import (
    BusinessErrorInfo,
    ConfirmationError,
    ConfirmationRequest,
    ConfirmationSendError,
    InvalidConfirmationError,
)
from confirmation.policy import ConfirmationPolicy
from confirmation.service import ConfirmationInfo, ConfirmationService, ProcessReport, request_from_message
from confirmation.transports import HttpJsonConfirmation, SoapConfirmation

__all__ = [
    "BusinessErrorInfo",
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
