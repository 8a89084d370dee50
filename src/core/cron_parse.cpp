// The cron grammar (core/cron.hpp): fields, lists, ranges, steps, names, `$`
// and the @ shortcuts, with errors that name the field and the byte offset.
#include "core/cron.hpp"
#include "core/civil.hpp"

namespace pg_throttle::core {
namespace {

struct FieldKind {
    const char* name;
    int low;
    int high;
    const char* const* names;  // three-letter names for low.., or nullptr
    int name_count;
};

constexpr const char* kMonthNames[] = {"jan", "feb", "mar", "apr", "may", "jun",
                                       "jul", "aug", "sep", "oct", "nov", "dec"};
constexpr const char* kWeekdayNames[] = {"sun", "mon", "tue", "wed", "thu", "fri", "sat"};

constexpr FieldKind kSecond{"second", 0, 59, nullptr, 0};
constexpr FieldKind kMinute{"minute", 0, 59, nullptr, 0};
constexpr FieldKind kHour{"hour", 0, 23, nullptr, 0};
constexpr FieldKind kDay{"day of month", 1, 31, nullptr, 0};
constexpr FieldKind kMonth{"month", 1, 12, kMonthNames, 12};
constexpr FieldKind kWeekday{"day of week", 0, 7, kWeekdayNames, 7};

struct Shortcut {
    const char* name;
    const char* expression;
};

constexpr Shortcut kShortcuts[] = {
    {"@yearly", "0 0 1 1 *"}, {"@annually", "0 0 1 1 *"}, {"@monthly", "0 0 1 * *"},
    {"@weekly", "0 0 * * 0"}, {"@daily", "0 0 * * *"},    {"@midnight", "0 0 * * *"},
    {"@hourly", "0 * * * *"},
};

char lower(char c) noexcept {
    return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c;
}
bool is_digit(char c) noexcept {
    return c >= '0' && c <= '9';
}
bool is_alpha(char c) noexcept {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}
bool is_blank(char c) noexcept {
    return c == ' ' || c == '\t';
}

bool equals_ignoring_case(std::string_view a, std::string_view b) noexcept {
    if (a.size() != b.size()) {
        return false;
    }
    for (std::size_t i = 0; i < a.size(); ++i) {
        if (lower(a[i]) != lower(b[i])) {
            return false;
        }
    }
    return true;
}

// Reads one field's text; `base` is its offset in the whole expression.
class FieldParser {
public:
    FieldParser(const FieldKind& kind, std::string_view text, std::size_t base) noexcept
        : kind_(kind), text_(text), base_(base) {}

    // The set of values as bits, or false with error_ set.
    bool parse(std::uint64_t* bits) noexcept {
        *bits = 0;
        for (;;) {
            if (!item(bits)) {
                return false;
            }
            if (pos_ == text_.size()) {
                return true;
            }
            if (text_[pos_] != ',') {
                return fail("expected ',' or the end of the field");
            }
            ++pos_;
        }
    }

    CronError error() const noexcept { return error_; }

private:
    bool fail(const char* message) noexcept { return fail_at(pos_, message); }
    bool fail_at(std::size_t pos, const char* message) noexcept {
        error_ = CronError{kind_.name, base_ + pos, message};
        return false;
    }

    // A number or, where the field has them, a three-letter name.
    bool value(int* out) noexcept {
        const std::size_t start = pos_;
        if (pos_ < text_.size() && is_digit(text_[pos_])) {
            int number = 0;
            while (pos_ < text_.size() && is_digit(text_[pos_])) {
                if (number > 1000) {
                    return fail_at(start, "value out of range");
                }
                number = number * 10 + (text_[pos_] - '0');
                ++pos_;
            }
            if (number < kind_.low || number > kind_.high) {
                return fail_at(start, "value out of range");
            }
            *out = number;
            return true;
        }
        if (pos_ < text_.size() && is_alpha(text_[pos_])) {
            while (pos_ < text_.size() && is_alpha(text_[pos_])) {
                ++pos_;
            }
            const std::string_view word = text_.substr(start, pos_ - start);
            for (int i = 0; i < kind_.name_count; ++i) {
                if (equals_ignoring_case(word, kind_.names[i])) {
                    *out = kind_.low + i;
                    return true;
                }
            }
            return fail_at(start,
                           kind_.names != nullptr ? "unknown name" : "names are not allowed here");
        }
        return fail("expected a number, '*' or a name");
    }

    bool step(int* out) noexcept {
        const std::size_t start = pos_;
        if (pos_ >= text_.size() || !is_digit(text_[pos_])) {
            return fail("expected a step after '/'");
        }
        int number = 0;
        while (pos_ < text_.size() && is_digit(text_[pos_])) {
            if (number > 1000) {
                return fail_at(start, "step out of range");
            }
            number = number * 10 + (text_[pos_] - '0');
            ++pos_;
        }
        if (number < 1 || number > kind_.high) {
            return fail_at(start, "step out of range");
        }
        *out = number;
        return true;
    }

    bool item(std::uint64_t* bits) noexcept {
        int first = kind_.low;
        int last = kind_.high;
        bool range = true;
        if (pos_ < text_.size() && text_[pos_] == '*') {
            ++pos_;
        } else {
            const std::size_t start = pos_;
            if (!value(&first)) {
                return false;
            }
            last = first;
            range = false;
            if (pos_ < text_.size() && text_[pos_] == '-') {
                ++pos_;
                if (!value(&last)) {
                    return false;
                }
                if (last < first) {
                    return fail_at(start, "range starts after its end");
                }
                range = true;
            }
        }
        int stride = 1;
        if (pos_ < text_.size() && text_[pos_] == '/') {
            if (!range) {
                return fail("a step needs a range or '*' before it");
            }
            ++pos_;
            if (!step(&stride)) {
                return false;
            }
        }
        for (int v = first; v <= last; v += stride) {
            *bits |= std::uint64_t{1} << v;
        }
        return true;
    }

    const FieldKind& kind_;
    std::string_view text_;
    std::size_t base_;
    std::size_t pos_ = 0;
    CronError error_{};
};

CronParse refuse(const char* field, std::size_t offset, const char* message) noexcept {
    CronParse result{};
    result.ok = false;
    result.error = CronError{field, offset, message};
    return result;
}

// Whether some day of some allowed month can match. A day-of-week that
// takes part always can (every month has every weekday, and with '*' in
// day-of-month every month has day 1); otherwise some listed day must exist
// in some listed month (February has 29 days in leap years).
bool can_fire(const CronSpec& spec) noexcept {
    if (!spec.weekday_star || spec.day_star || spec.last_day) {
        return true;
    }
    for (int month = 1; month <= 12; ++month) {
        if ((spec.months & (1U << month)) == 0) {
            continue;
        }
        const int longest = month == 2 ? 29 : days_in_month(1, month);
        for (int day = 1; day <= longest; ++day) {
            if ((spec.days & (1U << day)) != 0) {
                return true;
            }
        }
    }
    return false;
}

struct Field {
    std::size_t start;
    std::string_view text;
};

CronParse parse_fields(std::string_view text) noexcept;

}  // namespace

CronParse parse_cron(std::string_view text) noexcept {
    if (text.size() > kCronMaxBytes) {
        return refuse("expression", kCronMaxBytes, "longer than 256 bytes");
    }
    for (std::size_t i = 0; i < text.size(); ++i) {
        const auto byte = static_cast<unsigned char>(text[i]);
        if ((byte < 0x20 && text[i] != '\t') || byte == 0x7f) {
            return refuse("expression", i, "control character");
        }
    }
    std::size_t begin = 0;
    while (begin < text.size() && is_blank(text[begin])) {
        ++begin;
    }
    if (begin < text.size() && text[begin] == '@') {
        std::size_t end = begin;
        while (end < text.size() && !is_blank(text[end])) {
            ++end;
        }
        for (std::size_t rest = end; rest < text.size(); ++rest) {
            if (!is_blank(text[rest])) {
                return refuse("expression", rest, "a shortcut stands alone");
            }
        }
        const std::string_view word = text.substr(begin, end - begin);
        if (equals_ignoring_case(word, "@reboot")) {
            return refuse("expression", begin, "@reboot is not supported: it names no instant");
        }
        for (const Shortcut& shortcut : kShortcuts) {
            if (equals_ignoring_case(word, shortcut.name)) {
                return parse_fields(shortcut.expression);
            }
        }
        return refuse("expression", begin, "unknown shortcut");
    }
    return parse_fields(text);
}

namespace {

CronParse parse_fields(std::string_view text) noexcept {
    Field fields[6];
    std::size_t count = 0;
    std::size_t pos = 0;
    for (;;) {
        while (pos < text.size() && is_blank(text[pos])) {
            ++pos;
        }
        if (pos == text.size()) {
            break;
        }
        if (count == 6) {
            return refuse("expression", pos, "more than six fields");
        }
        const std::size_t start = pos;
        while (pos < text.size() && !is_blank(text[pos])) {
            ++pos;
        }
        fields[count++] = Field{start, text.substr(start, pos - start)};
    }
    if (count == 2 && (equals_ignoring_case(fields[1].text, "seconds") ||
                       equals_ignoring_case(fields[1].text, "second"))) {
        return refuse("expression", fields[0].start,
                      "interval schedules ('N seconds') are not supported");
    }
    if (count < 5) {
        return refuse("expression", text.size(), "five fields expected (six with seconds)");
    }
    const std::size_t first = count == 6 ? 1 : 0;
    const FieldKind* kinds[6] = {&kSecond, &kMinute, &kHour, &kDay, &kMonth, &kWeekday};
    std::uint64_t bits[6] = {1, 0, 0, 0, 0, 0};  // seconds: {0} with five fields
    CronSpec spec{};
    for (std::size_t i = 0; i < count; ++i) {
        const std::size_t k = i + 1 - first;  // kinds index of field i
        const Field& field = fields[i];
        if (k == 3 && field.text == "$") {
            spec.last_day = true;
            continue;
        }
        if (const std::size_t dollar = field.text.find('$'); k == 3 && dollar != field.text.npos) {
            return refuse(kDay.name, field.start + dollar, "'$' stands alone in its field");
        }
        FieldParser parser(*kinds[k], field.text, field.start);
        if (!parser.parse(&bits[k])) {
            CronParse result{};
            result.error = parser.error();
            return result;
        }
    }
    spec.seconds = bits[0];
    spec.minutes = bits[1];
    spec.hours = static_cast<std::uint32_t>(bits[2]);
    spec.days = static_cast<std::uint32_t>(bits[3]);
    spec.months = static_cast<std::uint16_t>(bits[4]);
    const std::uint64_t weekdays = bits[5] | ((bits[5] >> 7) & 1U);  // 7 is Sunday
    spec.weekdays = static_cast<std::uint8_t>(weekdays & 0x7fU);
    // Field i holds kind i + 1 - first: the hour is field 1 + first, and so on.
    spec.hour_star = fields[1 + first].text.front() == '*';
    spec.day_star = fields[2 + first].text.front() == '*';
    spec.weekday_star = fields[4 + first].text.front() == '*';
    if (!can_fire(spec)) {
        return refuse(kDay.name, fields[2 + first].start,
                      "the schedule never fires: no listed day exists in a listed month");
    }
    CronParse result{};
    result.ok = true;
    result.spec = spec;
    return result;
}

}  // namespace

bool cron_day_matches(const CronSpec& spec, std::int64_t year, int month, int day,
                      int weekday) noexcept {
    const bool day_match =
        (spec.days & (1U << day)) != 0 || (spec.last_day && day == days_in_month(year, month));
    const bool weekday_match = (spec.weekdays & (1U << weekday)) != 0;
    if (spec.day_star || spec.weekday_star) {
        return day_match && weekday_match;
    }
    return day_match || weekday_match;
}

}  // namespace pg_throttle::core
