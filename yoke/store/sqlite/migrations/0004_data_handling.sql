-- A workflow stream definition's data handling pins (seed 004, "Data
-- handling"; yoke/streams/pins.py). NULL: the stream pins none.
ALTER TABLE streams ADD COLUMN data_handling TEXT;
