-- The application's own objects that the documentation's examples (README.md,
-- CONTRIBUTING.md, docs/*.md) use, as a reader would have them:
-- test/integration/readme_examples.py creates them in each page's database
-- before it runs the page's examples.
CREATE FUNCTION rebuild_search_index() RETURNS void LANGUAGE sql AS $$ SELECT $$;

CREATE TABLE uploaded_images (id bigint PRIMARY KEY, processed boolean NOT NULL DEFAULT false);
INSERT INTO uploaded_images (id) SELECT generate_series(1, 30);

-- The roles of the least-privilege recipe (docs/security.md) and of the dashboard
-- (docs/dashboard.md), server-wide:
-- made once, kept between runs.
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'app_rw') THEN
        CREATE ROLE app_rw LOGIN;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'monitoring') THEN
        CREATE ROLE monitoring LOGIN;
    END IF;
    -- The dashboard's operator (docs/dashboard.md).
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'dashboard_operator') THEN
        CREATE ROLE dashboard_operator LOGIN;
    END IF;
END
$$;
