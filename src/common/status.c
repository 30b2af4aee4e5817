/* Status names and descriptions, read from the one table IHA_STATUS_MAP in iha.h. */
#include "iha.h"

const char *iha_status_name(iha_status status)
{
    switch (status) {
#define IHA_STATUS_NAME_(name, value, text) \
    case name:                              \
        return #name;
        IHA_STATUS_MAP(IHA_STATUS_NAME_)
#undef IHA_STATUS_NAME_
    }
    return "IHA_STATUS_UNKNOWN";
}

const char *iha_status_description(iha_status status)
{
    switch (status) {
#define IHA_STATUS_TEXT_(name, value, text) \
    case name:                              \
        return text;
        IHA_STATUS_MAP(IHA_STATUS_TEXT_)
#undef IHA_STATUS_TEXT_
    }
    return "unknown status code";
}

unsigned iha_version_number(void) { return IHA_VERSION_NUMBER; }

const char *iha_version_string(void) { return IHA_VERSION_STRING; }
