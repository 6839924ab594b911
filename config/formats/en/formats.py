"""Dates and times as operators read them in lists: ISO order, 24 hours, no words
("2025-01-31 08:00:03" instead of "Jan. 31, 2025, 8:00 a.m."), so the admin's tables fit a
1,400 px screen."""

DATE_FORMAT = "Y-m-d"
DATETIME_FORMAT = "Y-m-d H:i:s"
SHORT_DATETIME_FORMAT = "Y-m-d H:i"
TIME_FORMAT = "H:i:s"
