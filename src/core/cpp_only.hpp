// Included first by every header of the pure core. The core must never see a
// PostgreSQL header: it is built and unit-tested without a server.
#pragma once

#ifdef POSTGRES_H
#error "src/core must not be compiled together with PostgreSQL headers"
#endif
