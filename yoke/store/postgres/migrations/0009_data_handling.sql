-- A workflow stream definition's data handling pins (seed 004, "Data
-- handling"; yoke/streams/pins.py): placement, redaction, authorization and
-- content classes, fixed at creation like the rest of a pinned definition.
-- NULL: the stream pins none.
ALTER TABLE streams ADD COLUMN data_handling json;
