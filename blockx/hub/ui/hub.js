// A placeholder: the dashboard's pages replace it.
"use strict";
