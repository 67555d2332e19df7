"""Build the shipped text-to-SQL task ``sql_tiny``: two small SQLite databases and questions with gold SQL.

    python -m rlax_core.tasks.sql_tiny pipelines/assets/sql_tiny      # what made the shipped folder

Everything comes from a seeded generator (no data set is copied): a shop (customers, products,
orders) and a school (students, courses, enrollments), with names drawn from short fixed lists. The
questions are templates over the drawn values, at four levels of difficulty:

* ``1_single_table``  one table: a filter, a count, an order, an extreme value;
* ``2_join``          two or three tables joined on their keys;
* ``3_grouping``      GROUP BY with aggregates, HAVING, the largest group;
* ``4_nesting``       a subquery: above an average, NOT IN, a correlated extreme.

Each template's values are split between ``train.json`` and ``heldout.json`` (Spider's layout:
``db_id``, ``question``, ``query``, plus ``difficulty``), so held-out questions ask a known kind of
question about values the training split never names. Every gold query is run at build time and must
return at least one row. The databases lie flat beside the questions (``shop.sqlite``), a layout the
Spider reader takes as well as Spider's own ``database/<db_id>/<db_id>.sqlite``.
"""

from __future__ import annotations

import json
import random
import sqlite3
import sys
from pathlib import Path

SEED = 20261204
LEVELS = ("1_single_table", "2_join", "3_grouping", "4_nesting")
FIRST = ["Ann", "Ben", "Cara", "Dev", "Eli", "Fay", "Gus", "Hana", "Ivo", "Jun", "Kai", "Lea", "Milo", "Nia", "Omar",
         "Pia", "Quin", "Rosa", "Sam", "Tess", "Uma", "Vic", "Wes", "Yara", "Zed"]
CITIES = ["Oslo", "Lima", "Pune", "Kyiv", "Baku", "Doha", "Riga", "Quito"]
CATEGORIES = {"toys": ["kite", "yo-yo", "puzzle", "robot", "doll"], "books": ["atlas", "novel", "comic", "diary"],
              "garden": ["rake", "hose", "shovel", "seeds"], "kitchen": ["kettle", "whisk", "ladle", "teapot"]}
HOUSES = ["Oak", "Pine", "Birch", "Elm"]
DEPARTMENTS = {"math": ["Algebra", "Geometry", "Statistics"], "science": ["Biology", "Physics", "Chemistry"],
               "arts": ["Drawing", "Music", "Theatre"]}


def _shop(db: sqlite3.Connection, rng: random.Random) -> None:
    db.executescript("""
        CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT NOT NULL, city TEXT, joined_year INTEGER);
        CREATE TABLE products (id INTEGER PRIMARY KEY, name TEXT NOT NULL, category TEXT, price REAL);
        CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER REFERENCES customers(id),
                             product_id INTEGER REFERENCES products(id), quantity INTEGER, order_year INTEGER);
    """)
    names = rng.sample(FIRST, 20)
    db.executemany("INSERT INTO customers VALUES (?, ?, ?, ?)",
                   [(i + 1, name, CITIES[i % len(CITIES)], rng.randint(2015, 2024)) for i, name in enumerate(names)])
    products = [(name, category) for category, items in CATEGORIES.items() for name in items]
    db.executemany("INSERT INTO products VALUES (?, ?, ?, ?)",
                   [(i + 1, name, category, round(rng.uniform(2, 60), 2)) for i, (name, category) in enumerate(products)])
    # Customers 18-20 never order: "who never ordered" has an answer.
    db.executemany("INSERT INTO orders VALUES (?, ?, ?, ?, ?)",
                   [(i + 1, rng.randint(1, 17), rng.randint(1, len(products)), rng.randint(1, 5), rng.randint(2020, 2024))
                    for i in range(60)])


def _school(db: sqlite3.Connection, rng: random.Random) -> None:
    db.executescript("""
        CREATE TABLE students (id INTEGER PRIMARY KEY, name TEXT NOT NULL, grade INTEGER, house TEXT);
        CREATE TABLE courses (id INTEGER PRIMARY KEY, title TEXT NOT NULL, department TEXT, credits INTEGER);
        CREATE TABLE enrollments (student_id INTEGER REFERENCES students(id), course_id INTEGER REFERENCES courses(id),
                                  score REAL, PRIMARY KEY (student_id, course_id));
    """)
    names = rng.sample(FIRST, 18)
    db.executemany("INSERT INTO students VALUES (?, ?, ?, ?)",
                   [(i + 1, name, rng.randint(9, 12), HOUSES[i % len(HOUSES)]) for i, name in enumerate(names)])
    courses = [(title, department) for department, titles in DEPARTMENTS.items() for title in titles]
    db.executemany("INSERT INTO courses VALUES (?, ?, ?, ?)",
                   [(i + 1, title, department, rng.choice([2, 3, 4])) for i, (title, department) in enumerate(courses)])
    pairs = sorted(rng.sample([(s, c) for s in range(1, 17) for c in range(1, len(courses) + 1)], 70))
    db.executemany("INSERT INTO enrollments VALUES (?, ?, ?)", [(s, c, round(rng.uniform(40, 100), 1)) for s, c in pairs])


# (level, question template, gold SQL template, the values it ranges over)
SHOP = [
    ("1_single_table", "How many customers live in {city}?", "SELECT count(*) FROM customers WHERE city = '{city}'", "city"),
    ("1_single_table", "List the names of products in the {category} category, cheapest first.",
     "SELECT name FROM products WHERE category = '{category}' ORDER BY price ASC", "category"),
    ("1_single_table", "What is the price of the {product}?", "SELECT price FROM products WHERE name = '{product}'",
     "product"),
    ("1_single_table", "Which customers joined in {year} or later?",
     "SELECT name FROM customers WHERE joined_year >= {year}", "year"),
    ("2_join", "Which customers ordered the {product}?",
     "SELECT DISTINCT c.name FROM customers c JOIN orders o ON o.customer_id = c.id JOIN products p ON p.id = o.product_id "
     "WHERE p.name = '{product}'", "product"),
    ("2_join", "Which products did customers from {city} order?",
     "SELECT DISTINCT p.name FROM products p JOIN orders o ON o.product_id = p.id JOIN customers c ON c.id = o.customer_id "
     "WHERE c.city = '{city}'", "city"),
    ("3_grouping", "How many units of {category} products were ordered in total?",
     "SELECT sum(o.quantity) FROM orders o JOIN products p ON p.id = o.product_id WHERE p.category = '{category}'",
     "category"),
    ("3_grouping", "For each city, how many orders were placed in {order_year}?",
     "SELECT c.city, count(*) FROM orders o JOIN customers c ON c.id = o.customer_id WHERE o.order_year = {order_year} "
     "GROUP BY c.city", "order_year"),
    ("3_grouping", "Which customers placed more than {n} orders?",
     "SELECT c.name FROM customers c JOIN orders o ON o.customer_id = c.id GROUP BY c.id HAVING count(*) > {n}", "n"),
    ("4_nesting", "Which {category} products cost more than the average product?",
     "SELECT name FROM products WHERE category = '{category}' AND price > (SELECT avg(price) FROM products)", "category"),
    ("4_nesting", "Which customers from {city} never placed an order?",
     "SELECT name FROM customers WHERE city = '{city}' AND id NOT IN (SELECT customer_id FROM orders)", "city"),
]
SCHOOL = [
    ("1_single_table", "How many students are in grade {grade}?", "SELECT count(*) FROM students WHERE grade = {grade}",
     "grade"),
    ("1_single_table", "List the students of house {house} by name.",
     "SELECT name FROM students WHERE house = '{house}' ORDER BY name", "house"),
    ("1_single_table", "How many credits is {course} worth?", "SELECT credits FROM courses WHERE title = '{course}'",
     "course"),
    ("2_join", "Which students take {course}?",
     "SELECT s.name FROM students s JOIN enrollments e ON e.student_id = s.id JOIN courses c ON c.id = e.course_id "
     "WHERE c.title = '{course}'", "course"),
    ("2_join", "What are {student}'s scores in each course?",
     "SELECT c.title, e.score FROM enrollments e JOIN courses c ON c.id = e.course_id JOIN students s ON s.id = e.student_id "
     "WHERE s.name = '{student}'", "student"),
    ("3_grouping", "What is the average score in {course}?",
     "SELECT avg(e.score) FROM enrollments e JOIN courses c ON c.id = e.course_id WHERE c.title = '{course}'", "course"),
    ("3_grouping", "How many students of house {house} take courses in each department?",
     "SELECT c.department, count(DISTINCT s.id) FROM students s JOIN enrollments e ON e.student_id = s.id "
     "JOIN courses c ON c.id = e.course_id WHERE s.house = '{house}' GROUP BY c.department", "house"),
    ("4_nesting", "Who scored above the course average in {course}?",
     "SELECT s.name FROM students s JOIN enrollments e ON e.student_id = s.id JOIN courses c ON c.id = e.course_id "
     "WHERE c.title = '{course}' AND e.score > (SELECT avg(score) FROM enrollments WHERE course_id = c.id)", "course"),
    ("4_nesting", "Which students in grade {grade} take no {department} course?",
     "SELECT name FROM students WHERE grade = {grade} AND id NOT IN (SELECT e.student_id FROM enrollments e "
     "JOIN courses c ON c.id = e.course_id WHERE c.department = '{department}')", "grade_department"),
]


def _values(db: sqlite3.Connection, kind: str) -> list[dict]:
    one = {"city": "SELECT DISTINCT city FROM customers", "category": "SELECT DISTINCT category FROM products",
           "product": "SELECT name FROM products", "year": "SELECT DISTINCT joined_year FROM customers",
           "order_year": "SELECT DISTINCT order_year FROM orders", "n": "SELECT value FROM (SELECT 2 AS value UNION SELECT 3 "
           "UNION SELECT 4 UNION SELECT 5)", "grade": "SELECT DISTINCT grade FROM students",
           "house": "SELECT DISTINCT house FROM students", "course": "SELECT title FROM courses",
           "student": "SELECT name FROM students WHERE id IN (SELECT student_id FROM enrollments)"}
    if kind == "grade_department":
        return [{"grade": g["grade"], "department": d} for g in _values(db, "grade") for d in DEPARTMENTS]
    return [{kind: v} for v in sorted(row[0] for row in db.execute(one[kind]))]


def build(folder: str | Path, seed: int = SEED) -> dict[str, int]:
    """Write ``shop.sqlite``, ``school.sqlite``, ``train.json`` and ``heldout.json`` into ``folder``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    splits: dict[str, list[dict]] = {"train": [], "heldout": []}
    for db_id, fill, templates in (("shop", _shop, SHOP), ("school", _school, SCHOOL)):
        path = folder / f"{db_id}.sqlite"
        path.unlink(missing_ok=True)
        db = sqlite3.connect(path)
        fill(db, rng)
        db.commit()
        for level, question, query, kind in templates:
            values = [v for v in _values(db, kind) if db.execute(query.format(**v)).fetchall()]
            rng.shuffle(values)
            held = max(1, len(values) // 4)
            for split, chosen in (("heldout", values[:held]), ("train", values[held:])):
                splits[split] += [{"db_id": db_id, "question": question.format(**v), "query": query.format(**v),
                                   "difficulty": level} for v in chosen]
        db.execute("VACUUM")
        db.close()
        path.chmod(0o644)
    for split, rows in splits.items():
        (folder / f"{split}.json").write_text(json.dumps(rows, indent=1) + "\n")
    return {split: len(rows) for split, rows in splits.items()}


if __name__ == "__main__":
    print(build(sys.argv[1] if len(sys.argv) > 1 else "pipelines/assets/sql_tiny"))
