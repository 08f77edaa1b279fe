"""Eight EBNF grammars with strings each must accept and reject (not a test module).

Arithmetic and a comma list are left recursive; JSON, a SQL SELECT subset, CSV, a date
list, chess SAN moves and a nested list language cover literals, classes, bounded
repetition, nesting and recursion.
"""

from __future__ import annotations

ARITHMETIC = r"""
root   ::= expr
expr   ::= expr ("+" | "-") term | term      # left recursive
term   ::= term ("*" | "/") factor | factor
factor ::= [0-9]+ | "(" expr ")"
"""

JSON = r"""
root   ::= value
value  ::= object | array | string | number | ("true" | "false" | "null")
object ::= "{" ws ( string ws ":" ws value ws ("," ws string ws ":" ws value ws)* )? "}"
array  ::= "[" ws ( value ws ("," ws value ws)* )? "]"
string ::= "\"" ( [^"\\\x00-\x1f] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}) )* "\""
number ::= "-"? ("0" | [1-9] [0-9]*) ("." [0-9]+)? ([eE] [-+]? [0-9]+)?
ws     ::= [ \t\n]*
"""

SQL = r"""
root   ::= "SELECT " cols " FROM " name where? order? ";"
cols   ::= "*" | name (", " name)*
where  ::= " WHERE " cond (" AND " cond)*
cond   ::= name " " ("=" | "<" | ">" | "<=" | ">=" | "!=") " " (num | "'" [^']* "'")
order  ::= " ORDER BY " name (" ASC" | " DESC")?
name   ::= [a-z_] [a-z_0-9]*
num    ::= [0-9]+
"""

CSV = r"""
root   ::= header ("\n" row)* "\n"?
header ::= field ("," field)*
row    ::= field ("," field)*
field  ::= [^,\n"]* | "\"" ([^"] | "\"\"")* "\""
"""

DATES = r"""
root ::= date ("," " "? date){0,9}
date ::= year "-" month "-" day
year ::= [12] [0-9]{3}
month ::= "0" [1-9] | "1" [0-2]
day ::= "0" [1-9] | [12] [0-9] | "3" [01]
"""

CHESS = r"""
root     ::= move (" " move)*
move     ::= castle check? | piece disamb? capture? square promo? check?
castle   ::= "O-O" | "O-O-O"
piece    ::= [KQRBN]?
disamb   ::= [a-h] | [1-8] | [a-h][1-8]
capture  ::= "x"
square   ::= [a-h] [1-8]
promo    ::= "=" [QRBN]
check    ::= "+" | "#"
"""

NESTED = r"""
root ::= list
list ::= "(" ws (item (ws item)*)? ws ")"
item ::= atom | list
atom ::= [a-z]+ | [0-9]+
ws   ::= " "*
"""

LEFT_LIST = r"""
root ::= items "."
items ::= items "," item | item
item ::= "a" | "b" item
"""

GRAMMARS = {
    "arithmetic": (
        ARITHMETIC,
        ["1", "1+2*3", "(1+2)*3", "12/(3-1)-4"],
        ["", "1+", "(1", "+1", "1**2", "1)"],
    ),
    "json": (
        JSON,
        ['{"a": [1, 2.5e3, "x\\n"], "b": {"c": null}}', "[]", '"h\u00e9"', "-0.5", "true"],
        ['{"a" 1}', "[1,]", '{"a":tru}', "01", '"\\x"', '{"a":1'],
    ),
    "sql": (
        SQL,
        [
            "SELECT * FROM users;",
            "SELECT id, name FROM t WHERE a >= 3 AND b = 'x' ORDER BY id DESC;",
        ],
        ["SELECT FROM t;", "SELECT * FROM 1t;", "SELECT * FROM t WHERE a = ;", "select * from t;"],
    ),
    "csv": (CSV, ["a,b\n1,2\n", 'name,"x,""y"""\n3,4', "x"], ['a,"b\n', 'a"b,c']),
    "dates": (
        DATES,
        ["2024-01-31", "1999-12-01, 2000-02-29,2001-10-10"],
        ["2024-13-01", "2024-00-10", "2024-1-1", "3000-01-01", ",".join(["2024-01-01"] * 11)],
    ),
    "chess": (
        CHESS,
        ["e4 e5 Nf3 Nc6 Bb5 a6", "O-O Qxd8+ exd8=Q#", "Nbd7 R1e2"],
        ["e9", "Ke", "O-O-O-O", "Pe4 "],
    ),
    "nested": (NESTED, ["()", "(a (b 1) ((c)))", "( x  y )"], ["(", "(a))", "(a (b)", "a", "(A)"]),
    "left_list": (LEFT_LIST, ["a.", "a,ba,bba."], ["a", ",a.", "a,,a.", "c."]),
}
