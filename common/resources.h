// This process's memory use, for metrics and benchmark reports.
#pragma once

namespace farm {

double MaxRssMb();      // peak resident set since start (MiB)
double CurrentRssMb();  // resident set now (MiB)

}  // namespace farm
